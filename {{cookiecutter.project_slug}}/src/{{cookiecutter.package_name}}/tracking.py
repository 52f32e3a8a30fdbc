"""Experiment tracking (--report_to): offline by default, from rank 0 only, one tracker run per output_dir.

`tracker_settings` decides each tracker's settings, once: yours where you set its environment variable,
else offline under output_dir. Rank 0 records the run id in output_dir/tracker_run.json on the first run,
and a resume continues that run. trackers.py hands the settings to the loop's trackers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
from collections.abc import Callable, Collection
from pathlib import Path

from .config import ConfigError

TRACKERS = ["none", "tensorboard", "wandb", "mlflow"]  # each one's package: an extra in pyproject.toml
RUN_FILE = "tracker_run.json"
PROJECT = __package__.split(".")[0]  # the wandb project and mlflow experiment, unless set


def check_installed(report_to: Collection[str]) -> None:
    """Refuse a tracker whose package is missing while parsing: one line, not a traceback in every worker."""
    for tracker in TRACKERS[1:]:
        if tracker in report_to and importlib.util.find_spec(tracker) is None:
            raise ConfigError(f"--report_to {tracker}: the {tracker} package is not installed; "
                              f'pip install -e ".[{tracker}]" (or leave --report_to at none)')


def tracker_settings(tracker: str, output_dir: str, is_main_process: bool) -> dict[str, str]:
    """`tracker`'s settings, each under the environment variable that sets it: yours where set, else offline
    in output_dir. On rank 0 also the run to log into: yours, the one output_dir records, or a new one."""
    output = Path(output_dir).resolve()
    offline = {
        "tensorboard": {"TENSORBOARD_LOGGING_DIR": str(output / "runs")},  # a resume adds its files there
        "wandb": {"WANDB_MODE": "offline", "WANDB_DIR": str(output), "WANDB_PROJECT": PROJECT},
        # A SQLite file: mlflow 3 refuses its old ./mlruns file store unless told otherwise.
        "mlflow": {"MLFLOW_TRACKING_URI": f"sqlite:///{output / 'mlflow.db'}",
                   "MLFLOW_EXPERIMENT_NAME": PROJECT},
    }[tracker]
    settings = {name: os.environ.get(name, value) for name, value in offline.items()}
    if is_main_process:
        output.mkdir(parents=True, exist_ok=True)
    if is_main_process and tracker == "wandb":
        settings["WANDB_RUN_ID"] = os.environ.get("WANDB_RUN_ID") or recorded_run_id(
            output, "wandb", lambda: secrets.token_hex(4))
        settings["WANDB_RESUME"] = os.environ.get("WANDB_RESUME", "allow")
    if is_main_process and tracker == "mlflow":
        uri = settings["MLFLOW_TRACKING_URI"]  # a run id belongs to one store
        settings["MLFLOW_RUN_ID"] = os.environ.get("MLFLOW_RUN_ID") or recorded_run_id(
            output, f"mlflow {uri}", lambda: new_mlflow_run(uri, settings["MLFLOW_EXPERIMENT_NAME"]))
    return settings


def recorded_run_id(output: Path, key: str, new_run_id: Callable[[], str]) -> str:
    path = output / RUN_FILE
    record = json.loads(path.read_text()) if path.is_file() else {}
    if key not in record:
        record[key] = new_run_id()
        path.write_text(json.dumps(record, indent=1) + "\n")
    return record[key]


def new_mlflow_run(uri: str, experiment_name: str) -> str:
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(experiment_name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(experiment_name)
    return client.create_run(experiment_id).info.run_id


def start_mlflow_run(settings: dict[str, str]) -> dict[str, str]:
    """Make output_dir's mlflow run the active run of this process (rank 0); return the flags it holds
    already, an earlier leg's: mlflow refuses to change a param."""
    import mlflow

    mlflow.set_tracking_uri(settings["MLFLOW_TRACKING_URI"])
    return mlflow.start_run(run_id=settings["MLFLOW_RUN_ID"]).data.params
