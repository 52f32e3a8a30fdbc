"""--report_to's settings (tracking.py): offline defaults that your own settings override, and nothing
from ranks other than 0. Trained for real with each tracker: the template's proofs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import IS_NATIVE, package_module

tracking = package_module("tracking")
TRACKER_ENV_PREFIXES = ("WANDB_", "MLFLOW_", "TENSORBOARD_")


@pytest.fixture
def tracker_free_environ():
    """os.environ without the trackers' variables during the test, as it was after it."""
    saved = dict(os.environ)
    for name in saved:
        if name.startswith(TRACKER_ENV_PREFIXES):
            del os.environ[name]
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.usefixtures("tracker_free_environ")
def test_other_ranks_write_nothing_and_start_no_tracker(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    tracking.configure_tracker(tracking.TRACKERS, str(output_dir), is_main_process=False)
    assert list(tmp_path.iterdir()) == []
    assert "WANDB_RUN_ID" not in os.environ and "MLFLOW_RUN_ID" not in os.environ
    assert os.environ["WANDB_MODE"] == "offline"  # the same settings as rank 0, should a library read them
    if IS_NATIVE:
        trackers = package_module("trackers")
        assert trackers.start_tracker("wandb", str(output_dir), {}, is_main_process=False) is None


@pytest.mark.usefixtures("tracker_free_environ")
def test_settings_you_made_win_over_the_offline_defaults(tmp_path: Path) -> None:
    os.environ.update(WANDB_MODE="online", WANDB_PROJECT="mine", WANDB_RUN_ID="given",
                      TENSORBOARD_LOGGING_DIR=str(tmp_path / "board"))
    tracking.configure_tracker(["tensorboard", "wandb"], str(tmp_path / "out"), is_main_process=True)
    assert (os.environ["WANDB_MODE"], os.environ["WANDB_PROJECT"], os.environ["WANDB_RUN_ID"]) == (
        "online", "mine", "given")
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "board")
    assert not (tmp_path / "out" / tracking.RUN_FILE).exists()  # nothing recorded: your run id is used as given
