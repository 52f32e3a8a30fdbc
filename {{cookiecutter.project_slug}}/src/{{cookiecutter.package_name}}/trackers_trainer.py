"""The Trainer's trackers (--report_to): transformers' callbacks, handed tracking.py's settings."""

from __future__ import annotations

import os
import sys
from collections.abc import Collection

from .tracking import TRACKERS, start_mlflow_run, tracker_settings


def configure_trackers(report_to: Collection[str], output_dir: str, is_main_process: bool) -> None:
    """On every rank, before the Trainer is built: transformers' callbacks read their settings from the
    environment only. On rank 0 output_dir's mlflow run is started here: started by its callback, it would
    end at the end of training, and the final evaluation would start a new run."""
    for tracker in [name for name in TRACKERS[1:] if name in report_to]:
        settings = tracker_settings(tracker, output_dir, is_main_process)
        if "MLFLOW_RUN_ID" in settings:
            if start_mlflow_run(settings):  # a resumed run keeps its first flags: the callback logs none
                os.environ.setdefault("MLFLOW_MAX_LOG_PARAMS", "0")
            del settings["MLFLOW_RUN_ID"]
            os.environ.pop("MLFLOW_RUN_ID", None)  # the callback would start the active run again
        os.environ.update(settings)


def close_trackers() -> None:
    """End the wandb and mlflow runs the Trainer's callbacks leave open until exit, where wandb would
    print its closing lines with colour codes into log files. A package not imported was not used."""
    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()
    if "mlflow" in sys.modules and sys.modules["mlflow"].active_run() is not None:
        sys.modules["mlflow"].end_run()
