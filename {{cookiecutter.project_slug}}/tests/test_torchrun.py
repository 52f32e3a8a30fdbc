"""How `python -m <package>.torchrun` ends after a SIGTERM, from how its workers ended (no real launch:
the template's tests/proofs/test_preemption.py and test_slurm.py stop real runs)."""

from __future__ import annotations

import pytest
from conftest import package_module

torchrun = package_module("torchrun")
SAVED = torchrun.STOPPED_EXIT_CODE


@pytest.mark.parametrize(("statuses", "code", "line"), [
    ({11: SAVED, 12: SAVED}, SAVED, "torchrun: stopped by SIGTERM: all 2 worker(s) here saved the step they reached"),
    ({11: 0, 12: 0}, 0, "torchrun: SIGTERM came as the run ended: all 2 worker(s) here had finished it"),
    ({11: SAVED, 12: 1}, 1, "torchrun: stopped by SIGTERM, but worker(s) 12 (exit status 1) did not save"),
    ({11: 0, 12: None}, 1, "torchrun: stopped by SIGTERM, but worker(s) 11 (exit status 0), 12 (still running)"),
    ({}, 1, "torchrun: stopped by SIGTERM before any worker started: nothing was saved"),
], ids=["all-saved", "all-finished", "one-failed", "one-still-running", "none-started"])
def test_the_exit_status_says_whether_the_workers_saved_or_finished(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, statuses: dict, code: int, line: str
) -> None:
    def stopped(argv: list[str]) -> None:
        raise torchrun.WorkersStopped(statuses)

    monkeypatch.setattr(torchrun, "run_torchrun", stopped)
    monkeypatch.setattr(torchrun.signal, "signal", lambda *args: None)  # leave pytest's own SIGTERM handling alone
    with pytest.raises(SystemExit) as exit_:
        torchrun.main(["--nproc-per-node=2", "-m", "x"])
    assert exit_.value.code == code
    assert capsys.readouterr().err.startswith(line)
