"""--report_to's settings (tracking.py): offline defaults that your own settings override, and nothing
from ranks other than 0. Trained for real with each tracker: the template's proofs."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import IS_NATIVE, REQUIRED, package_module

config = package_module("config")
tracking = package_module("tracking")
trackers = package_module("trackers")
TRACKER_ENV_PREFIXES = ("WANDB_", "MLFLOW_", "TENSORBOARD_")


@pytest.fixture(autouse=True)
def tracker_free_environ():
    saved = dict(os.environ)
    for name in saved:
        if name.startswith(TRACKER_ENV_PREFIXES):
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_other_ranks_write_nothing_and_start_no_tracker(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    settings = {tracker: tracking.tracker_settings(tracker, str(output_dir), is_main_process=False)
                for tracker in tracking.TRACKERS[1:]}
    assert settings["wandb"] == {"WANDB_MODE": "offline", "WANDB_DIR": str(output_dir.resolve()),
                                 "WANDB_PROJECT": tracking.PROJECT}
    assert "MLFLOW_RUN_ID" not in settings["mlflow"]  # the run is rank 0's
    if IS_NATIVE:
        assert trackers.start_tracker("wandb", str(output_dir), {}, is_main_process=False) is None
    else:  # the same settings as rank 0, should a library read them
        trackers.configure_trackers(tracking.TRACKERS, str(output_dir), is_main_process=False)
        assert os.environ["WANDB_MODE"] == "offline" and "WANDB_RUN_ID" not in os.environ
    assert list(tmp_path.iterdir()) == []


def test_rank_0_records_a_run_id_to_continue_but_your_settings_win(tmp_path: Path) -> None:
    first = tracking.tracker_settings("wandb", str(tmp_path), is_main_process=True)
    assert (first["WANDB_DIR"], first["WANDB_RESUME"]) == (str(tmp_path.resolve()), "allow")
    assert tracking.tracker_settings("wandb", str(tmp_path), is_main_process=True) == first
    assert json.loads((tmp_path / tracking.RUN_FILE).read_text()) == {"wandb": first["WANDB_RUN_ID"]}
    os.environ.update(WANDB_MODE="online", WANDB_PROJECT="mine", WANDB_RUN_ID="given",
                      TENSORBOARD_LOGGING_DIR=str(tmp_path / "board"))
    output_dir = str(tmp_path / "out")
    wandb = tracking.tracker_settings("wandb", output_dir, is_main_process=True)
    assert (wandb["WANDB_MODE"], wandb["WANDB_PROJECT"], wandb["WANDB_RUN_ID"]) == ("online", "mine", "given")
    tensorboard = tracking.tracker_settings("tensorboard", output_dir, is_main_process=True)
    assert tensorboard == {"TENSORBOARD_LOGGING_DIR": str(tmp_path / "board")}
    assert not (tmp_path / "out" / tracking.RUN_FILE).exists()  # nothing recorded: your run id is used as given


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_a_tracker_that_is_not_installed_is_refused_with_its_pip_command(tracker: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == tracker else real_find_spec(name, *rest))
    with pytest.raises(config.ConfigError) as refusal:
        config.parse_args(package_module("training_args").TrainingArguments, [*REQUIRED, "--report_to", tracker])
    assert str(refusal.value) == (f"--report_to {tracker}: the {tracker} package is not installed; "
                                  f'pip install -e ".[{tracker}]" (or leave --report_to at none)')
