"""How `python -m <package>.torchrun` starts its workers, and how it ends after a SIGTERM, from how its workers
ended (no real launch: tests/test_launch_end_to_end.py launches, and the template's tests/proofs/
test_preemption.py and test_slurm.py stop real runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, package_module

torchrun = package_module("torchrun")
SAVED = torchrun.STOPPED_EXIT_CODE


@pytest.mark.parametrize(("statuses", "code", "line"), [
    ({11: SAVED, 12: SAVED}, SAVED, "torchrun: stopped by SIGTERM: all 2 worker(s) here saved the step they reached"),
    ({11: 0, 12: 0}, 0, "torchrun: SIGTERM came as the run ended: all 2 worker(s) here had finished it"),
    ({11: SAVED, 12: 1}, 1, "torchrun: stopped by SIGTERM, but worker(s) 12 (exit status 1) did not save"),
    ({11: 0, 12: None}, 1, "torchrun: stopped by SIGTERM, but worker(s) 11 (exit status 0), 12 (still running)"),
    ({11: SAVED, 12: -15}, 1, "torchrun: stopped by SIGTERM, but worker(s) 12 (killed by SIGTERM) did not save"),
    ({}, 1, "torchrun: stopped by SIGTERM before any worker started: nothing was saved"),
], ids=["all-saved", "all-finished", "one-failed", "one-still-running", "one-killed", "none-started"])
def test_the_exit_status_says_whether_the_workers_saved_or_finished(
    capsys: pytest.CaptureFixture, statuses: dict, code: int, line: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        torchrun.end_after_sigterm(statuses)
    ended = exit_.value.code  # a line of text: the launcher's exit_now prints it and exits with status 1
    status, said = (1, ended) if isinstance(ended, str) else (ended, capsys.readouterr().err)
    assert status == code and said.startswith(line), said


def test_module_workers_fork_from_the_launcher_after_the_import_never_after_cuda(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFLIGHT_WORLD_SIZE", raising=False)
    monkeypatch.delitem(sys.modules, f"{PACKAGE}.metrics", raising=False)
    frozen = []  # after the import; a real gc.freeze() would leave pytest's own objects frozen
    monkeypatch.setattr(torchrun.gc, "freeze", lambda: frozen.append(f"{PACKAGE}.metrics" in sys.modules))
    argv = torchrun.fork_workers_from_here(
        ["--standalone", "-m", "--nproc-per-node=2", f"{PACKAGE}.metrics", "-m", "x"])
    worker = str(Path(torchrun.__file__).with_name("worker.py"))
    assert argv == ["--standalone", "--nproc-per-node=2", "--run-path", "--start-method=fork", worker,
                    f"{PACKAGE}.metrics", "-m", "x"]
    assert f"{PACKAGE}.metrics" in sys.modules and frozen == [True]
    assert torchrun.fork_workers_from_here(["--nproc-per-node=2", "train.py", "-m"]) == [
        "--nproc-per-node=2", "train.py", "-m"]  # a script: torchrun starts it as a command
    monkeypatch.setattr("torch.cuda.is_initialized", lambda: True)
    with pytest.raises(SystemExit) as exit_:  # the launcher prints the line and exits with status 1
        torchrun.fork_workers_from_here(["--nproc-per-node=2", "-m", f"{PACKAGE}.metrics"])
    assert exit_.value.code == (f"error: {PACKAGE}.torchrun initialised CUDA before forking the workers, "
                                "which would then fail to use their GPUs: nothing was started")
