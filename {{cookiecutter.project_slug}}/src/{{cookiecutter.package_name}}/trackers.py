"""The native loop's trackers (--report_to): each has log(scalars, step) and close()."""

from __future__ import annotations

import json
import os

from .tracking import configure_tracker


class TensorBoardTracker:
    def __init__(self, config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.environ["TENSORBOARD_LOGGING_DIR"])
        self.writer.add_text("args", json.dumps(config, indent=1))

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, config: dict) -> None:
        import wandb

        self.run = wandb.init(config=config)  # project, mode, folder, run id and resume: from the environment

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    def __init__(self, config: dict) -> None:
        import mlflow

        self.mlflow = mlflow  # configure_tracker started the run
        if not mlflow.active_run().data.params:  # a resumed run keeps its first flags
            mlflow.log_params(config)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(scalars, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


Tracker = TensorBoardTracker | WandbTracker | MlflowTracker
TRACKER_CLASSES = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def start_tracker(report_to: str, output_dir: str, config: dict, is_main_process: bool) -> Tracker | None:
    """Configured on every rank (tracking.py), started on rank 0 only: None elsewhere, and for none."""
    configure_tracker([report_to], output_dir, is_main_process)
    return TRACKER_CLASSES[report_to](config) if report_to != "none" and is_main_process else None
