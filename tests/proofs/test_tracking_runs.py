"""--report_to, trained for real: each tracker writes its files offline into output_dir, and a resumed run
continues the same tracker run.

For wandb and mlflow the smoke job trains twice in one output_dir, as one process: one epoch, then
the same command with two epochs, which resumes from the first epoch's checkpoint. The tracker's
files must hold every loss the two legs printed, in one tracker run. (TensorBoard has no run id: a
resumed run writes into the same folder, so one leg shows that the loss lands there.) No test reaches a
network: the trackers' own environment variables are removed, so the defaults (offline) are what is tested.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import PACKAGE, package_module, run_env, smoke_flags
from test_tracking import TRACKER_ENV_PREFIXES
from warm_launch import run_python

pytestmark = [pytest.mark.slow, pytest.mark.tracker]  # real launches, in a render with a tracker
tracking = package_module("tracking")

# 64 examples in batches of 16: 4 steps per epoch, a loss logged every 2.
SHORT_RUN = ["--max_train_samples", "64", "--max_eval_samples", "16", "--logging_steps", "2"]


def tracker_free_env() -> dict[str, str]:
    return {name: value for name, value in run_env().items() if not name.startswith(TRACKER_ENV_PREFIXES)}


def train(tracker: str, assets: Path, output_dir: Path, legs: tuple[int, ...] = (1, 2)) -> dict[int, float]:
    """Train 2 epochs (by default 1, then resumed to 2); return {step: loss} as the legs printed it."""
    losses = {}
    for epochs in legs:
        result = run_python(["-m", f"{PACKAGE}.train", *smoke_flags(assets, output_dir), *SHORT_RUN, "--report_to",
                             tracker, "--num_train_epochs", str(epochs)], env=tracker_free_env())
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"step"')]
        losses |= {line["step"]: line["loss"] for line in lines if "loss" in line}
    assert sorted(losses) == [2, 4, 6, 8], losses  # every leg logged, a second one after resuming
    return losses


def test_tensorboard_event_files_hold_every_logged_loss(smoke_assets: Path, tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    losses = train("tensorboard", smoke_assets, tmp_path, legs=(2,))
    events = EventAccumulator(str(tmp_path / "runs"))  # this folder's files only: the Trainer's own default is deeper
    events.Reload()
    tag = "loss" if "loss" in events.Tags()["scalars"] else "train/loss"  # the native loop's, the Trainer's
    logged = {event.step: event.value for event in events.Scalars(tag)}
    assert logged == pytest.approx(losses, rel=1e-6)


BLOCK, HEADER = 32768, 7  # the LevelDB log format: 32 KiB blocks, 7-byte record headers


def wandb_history(path: Path) -> list[dict]:
    """The logged rows of a .wandb file: after a 7-byte W&B header, LevelDB log records that carry
    wandb_internal_pb2.Record messages, some of them split across blocks."""
    from wandb.proto.wandb_internal_pb2 import Record

    data, position, pending, rows = path.read_bytes(), HEADER, b"", []
    assert data.startswith(b":W&B")
    while position + HEADER <= len(data):
        if BLOCK - position % BLOCK < HEADER:  # too little room for a header: zero padding
            position += BLOCK - position % BLOCK
            continue
        length, kind = struct.unpack("<HB", data[position + 4 : position + HEADER])
        pending += data[position + HEADER : position + HEADER + length]
        position += HEADER + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = Record.FromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item} | {"_step": record.history.step.num})
    return rows


def test_wandb_offline_runs_of_both_legs_share_one_run_id_and_hold_every_loss(
        smoke_assets: Path, tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    losses = train("wandb", smoke_assets, tmp_path)
    run_id = json.loads((tmp_path / tracking.RUN_FILE).read_text())["wandb"]
    legs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert [leg.name.rsplit("-", 1)[1] for leg in legs] == [run_id, run_id]  # `wandb sync` joins them
    logged = {}
    for leg in legs:
        for row in wandb_history(leg / f"run-{run_id}.wandb"):
            step = row.get("train/global_step", row["_step"])  # the Trainer's x-axis, the native loop's step
            if "loss" in row or "train/loss" in row:
                logged[step] = row.get("loss", row.get("train/loss"))
    assert logged == pytest.approx(losses, rel=1e-6)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # mlflow's store on SQLAlchemy 2.1: not ours
def test_mlflow_sqlite_store_holds_one_run_with_every_loss_and_the_first_legs_flags(
        smoke_assets: Path, tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("sqlalchemy")
    from mlflow import MlflowClient

    losses = train("mlflow", smoke_assets, tmp_path)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(PACKAGE)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # the resumed leg and the final evaluation logged into the same run
    run = runs[0]
    assert json.loads((tmp_path / tracking.RUN_FILE).read_text()) == {
        f"mlflow sqlite:///{tmp_path.resolve() / 'mlflow.db'}": run.info.run_id}
    logged = {metric.step: metric.value for metric in client.get_metric_history(run.info.run_id, "loss")}
    assert logged == pytest.approx(losses, rel=1e-6)
    final_accuracy = client.get_metric_history(run.info.run_id, "eval_accuracy")[-1]
    assert (final_accuracy.step, final_accuracy.value) == (
        8, pytest.approx(json.loads((tmp_path / "metrics.json").read_text())["eval_accuracy"]))
    assert float(run.data.params["num_train_epochs"]) == 1.0  # mlflow keeps a param's first value
    assert run.info.status == "FINISHED"
