"""The native loop's trackers (--report_to), handed tracking.py's settings: each has log(scalars, step) and
close()."""

from __future__ import annotations

import json

from .tracking import start_mlflow_run, tracker_settings


class TensorBoardTracker:
    def __init__(self, settings: dict[str, str], config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(settings["TENSORBOARD_LOGGING_DIR"])
        self.writer.add_text("args", json.dumps(config, indent=1))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, settings: dict[str, str], config: dict) -> None:
        import wandb

        self.run = wandb.init(config=config, mode=settings["WANDB_MODE"], dir=settings["WANDB_DIR"],
                              project=settings["WANDB_PROJECT"], id=settings["WANDB_RUN_ID"],
                              resume=settings["WANDB_RESUME"])

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, settings: dict[str, str], config: dict) -> None:
        import mlflow

        self.mlflow = mlflow
        if not start_mlflow_run(settings):  # a resumed run keeps its first flags
            mlflow.log_params(config)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


Tracker = TensorBoardTracker | WandbTracker | MlflowTracker
TRACKER_CLASSES = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def start_tracker(report_to: str, output_dir: str, config: dict, is_main_process: bool) -> Tracker | None:
    """Started on rank 0 only: None elsewhere, and for none."""
    if report_to == "none" or not is_main_process:
        return None
    return TRACKER_CLASSES[report_to](tracker_settings(report_to, output_dir, is_main_process=True), config)
