"""Results are never lost: a finished run's command run again changes nothing, an evaluation alone
keeps the train figures, a resumed run reports the whole run, and predict refuses an output it cannot write
before it reads anything. One process, the smoke model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import PACKAGE, read_metrics, smoke_flags
from warm_launch import run_python

pytestmark = pytest.mark.slow  # real launches: `make test-all`

STEPS_PER_EPOCH = 16  # 256 train examples / batch 16, one process


def train(flags: list[str]) -> subprocess.CompletedProcess:
    result = run_python(["-m", f"{PACKAGE}.train", *flags])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module", params=[["--num_train_epochs", "1"], ["--max_steps", "12"]],
                ids=["epochs", "max-steps"])
def finished(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> dict:
    """A run to the end of an epoch, or to --max_steps in mid-epoch; then the same command again."""
    output_dir = tmp_path_factory.mktemp("finished")
    flags = [*smoke_flags(smoke_assets, output_dir), *request.param]
    train(flags)
    files = {name: (output_dir / name).read_bytes() for name in ("metrics.json", "training_curves.png")}
    again = train(flags)
    steps = STEPS_PER_EPOCH if "--num_train_epochs" in flags else 12
    return {"output_dir": output_dir, "flags": flags, "files": files, "again": again, "steps": steps}


def test_a_finished_run_run_again_says_so_and_leaves_its_results_as_they_were(finished: dict) -> None:
    output_dir = finished["output_dir"]
    assert f"{output_dir} holds this run, finished at step {finished['steps']}: nothing to train" in (
        finished["again"].stdout)
    for name, before in finished["files"].items():
        assert (output_dir / name).read_bytes() == before, f"{name} was rewritten"


def test_an_evaluation_alone_updates_the_eval_figures_and_keeps_the_train_figures(finished: dict) -> None:
    output_dir = finished["output_dir"]
    before = json.loads(finished["files"]["metrics.json"])
    flags = [*finished["flags"], "--do_train", "false", "--model_name_or_path", str(output_dir),
             "--max_eval_samples", "40"]
    train(flags)
    after = read_metrics(output_dir)
    assert after["eval_num_examples"] == 40 and before["eval_num_examples"] == 101
    assert {key: value for key, value in after.items() if not key.startswith("eval_")} == {
        key: value for key, value in before.items() if not key.startswith("eval_")}
    assert before["train_steps"] == finished["steps"] and "train_loss" in after
    assert (output_dir / "training_curves.png").read_bytes() == finished["files"]["training_curves.png"]


def saved_runtime(checkpoint: Path) -> float:
    """The train_runtime a checkpoint holds: what a run resumed from it adds its own time to."""
    if (checkpoint / "run_totals.json").is_file():  # the Trainer's
        return json.loads((checkpoint / "run_totals.json").read_text())["train_runtime"]
    import torch
    return torch.load(checkpoint / "training_state.pt", weights_only=True)["run_totals"]["train_runtime"]


def test_a_resumed_run_reports_the_whole_run(smoke_assets: Path, tmp_path: Path) -> None:
    flags = smoke_flags(smoke_assets, tmp_path)
    train([*flags, "--num_train_epochs", "1"])
    first, first_saved = read_metrics(tmp_path), saved_runtime(tmp_path / f"checkpoint-{STEPS_PER_EPOCH}")
    resumed = train([*flags, "--num_train_epochs", "2"])
    assert "resum" in resumed.stdout
    whole = read_metrics(tmp_path)
    assert (first["train_steps"], whole["train_steps"]) == (STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH)
    # Each leg's last step saved: it reports what its checkpoint holds, so a resume counts no second twice.
    assert first["train_runtime"] == pytest.approx(first_saved, abs=1e-4)
    assert whole["train_runtime"] == pytest.approx(saved_runtime(tmp_path / f"checkpoint-{2 * STEPS_PER_EPOCH}"),
                                                   abs=1e-4)
    assert whole["train_runtime"] > first["train_runtime"]  # both legs, not the second alone
    assert whole["train_samples_per_second"] == pytest.approx(2 * 256 / whole["train_runtime"], rel=0.01)
    # The mean loss of both legs: each logged loss weighed by the steps since the log before.
    history = (json.loads((tmp_path / "log_history.json").read_text()) if (tmp_path / "log_history.json").is_file()
               else json.loads((tmp_path / "trainer_state.json").read_text())["log_history"])
    losses = [(entry["step"], entry["loss"]) for entry in history if "loss" in entry]
    assert losses[-1][0] == 2 * STEPS_PER_EPOCH
    assert STEPS_PER_EPOCH in [step for step, _ in losses]  # the first leg's last log is kept
    starts = [0] + [step for step, _ in losses[:-1]]
    weighted = sum(loss * (step - start) for (step, loss), start in zip(losses, starts, strict=True))
    assert whole["train_loss"] == pytest.approx(weighted / (2 * STEPS_PER_EPOCH), abs=1e-5)
    assert whole["train_loss"] != pytest.approx(first["train_loss"], abs=1e-3)


def test_predict_cli_refuses_an_unknown_output_suffix_with_one_error_line(tmp_path: Path) -> None:
    output_file = str(tmp_path / "predictions.txt")
    result = run_python(["-m", f"{PACKAGE}.predict", "--model_name_or_path", str(tmp_path / "model"),
                         "--input_file", str(tmp_path / "rows.csv"), "--output_file", output_file], timeout=120)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [f"error: --output_file '{output_file}': use .csv, .json, .jsonl or .parquet"], result.stderr
    assert "Traceback" not in result.stderr
