"""Experiment tracking (--report_to): offline by default, from rank 0 only, one tracker run per output_dir.

`configure_tracker` runs on every rank before anything logs: it sets the environment variables each
tracker reads, where you have not, for the Trainer's callbacks or the native loop's trackers.py. Rank 0
records the run id in output_dir/tracker_run.json on the first run, and a resume continues that run.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Collection
from pathlib import Path

TRACKERS = ["none", "tensorboard", "wandb", "mlflow"]  # each one's package: an extra in pyproject.toml
RUN_FILE = "tracker_run.json"
PROJECT = __package__.split(".")[0]  # the wandb project and mlflow experiment, unless set


def configure_tracker(report_to: Collection[str], output_dir: str, is_main_process: bool) -> None:
    """Set the chosen trackers' defaults (offline, under output_dir); on rank 0 also their run ids."""
    output = Path(output_dir).resolve()
    if is_main_process and set(report_to) & set(TRACKERS[1:]):
        output.mkdir(parents=True, exist_ok=True)
    if "tensorboard" in report_to:  # a resumed run appends to the same folder
        os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(output / "runs"))
    if "wandb" in report_to:
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_DIR", str(output))
        os.environ.setdefault("WANDB_PROJECT", PROJECT)
        if is_main_process and "WANDB_RUN_ID" not in os.environ:
            os.environ.update(WANDB_RUN_ID=recorded_run_id(output, "wandb", lambda: secrets.token_hex(4)),
                              WANDB_RESUME="allow")
    if "mlflow" in report_to:
        # A SQLite file: mlflow 3 refuses its old ./mlruns file store unless told otherwise.
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{output / 'mlflow.db'}")
        os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", PROJECT)
        if is_main_process:
            start_mlflow_run(output)


def recorded_run_id(output: Path, key: str, new_run_id: Callable[[], str]) -> str:
    path = output / RUN_FILE
    record = json.loads(path.read_text()) if path.is_file() else {}
    if key not in record:
        record[key] = new_run_id()
        path.write_text(json.dumps(record, indent=1) + "\n")
    return record[key]


def start_mlflow_run(output: Path) -> None:
    """Make output_dir's mlflow run (or MLFLOW_RUN_ID) the active run of this process, on rank 0.

    Started here, the Trainer's MLflowCallback logs into it and leaves it open: started by the
    callback, it would end at the end of training and the final evaluation would start a new run.
    A resumed run keeps its first flags (mlflow refuses to change a param), so the callback logs none.
    """
    import mlflow

    key = f"mlflow {os.environ['MLFLOW_TRACKING_URI']}"  # a run id belongs to one store
    run_id = os.environ.pop("MLFLOW_RUN_ID", None) or recorded_run_id(output, key, new_mlflow_run)
    if mlflow.start_run(run_id=run_id).data.params:
        os.environ.setdefault("MLFLOW_MAX_LOG_PARAMS", "0")


def new_mlflow_run() -> str:
    import mlflow

    experiment = mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])  # created if missing
    return mlflow.MlflowClient().create_run(experiment.experiment_id).info.run_id
