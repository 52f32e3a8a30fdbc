"""SIGTERM, as SLURM (--signal, time limit, preemption) and Kubernetes send before they take a node
back: the run saves the step it reached, exits in bounded time with nothing half-written and no
process left, and the same command then resumes there and ends as if it had never stopped.

The signal goes to the launch script (which execs torchrun), as a scheduler sends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import IS_NATIVE, PACKAGE, REPO_ROOT, TRAIN_SIZE, package_module, run_env, smoke_flags
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from warm_launch import torchrun

pytestmark = pytest.mark.slow  # real launches: `make test-all`

SCRIPT = str(REPO_ROOT / "scripts" / "train_single_node.sh")
STEPS_PER_EPOCH = TRAIN_SIZE // (2 * 16)  # 2 ranks x per-device batch 16 (configs/smoke.yaml)
FLAGS = ["--num_train_epochs", "3", "--save_strategy", "epoch"]
STOPPED_EXIT_CODE = 128 + signal.SIGTERM
# Resuming replays the same operations in the same order; the tolerance leaves room for a kernel
# that is not bitwise deterministic.
WEIGHTS_ATOL = 1e-6


def launch(flags: list[str], log: Path) -> subprocess.Popen:
    """The single-node script in its own session (so no process of it can hide), output to a file."""
    with log.open("w") as out:
        return subprocess.Popen([SCRIPT, *flags], cwd=REPO_ROOT, env=run_env(NPROC_PER_NODE="2"), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait(process: subprocess.Popen, log: Path, timeout: float = 300) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"still running after {timeout} s:\n{log.read_text()[-3000:]}")


def checkpoint_steps(output_dir: Path) -> list[int]:
    return sorted(int(path.name.split("-")[1]) for path in output_dir.glob("checkpoint-*"))


def launch_until_first_checkpoint(smoke_assets: Path, output_dir: Path, log: Path) -> subprocess.Popen:
    process = launch([*smoke_flags(smoke_assets, output_dir), *FLAGS], log)
    deadline = time.monotonic() + 240
    while not (output_dir / f"checkpoint-{STEPS_PER_EPOCH}").is_dir():
        assert process.poll() is None, f"ended before its first checkpoint:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no first checkpoint after 240 s"
        time.sleep(0.05)
    return process


@pytest.fixture(scope="module")
def uninterrupted(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same flags, not disturbed (started warm: see tests/conftest.py's torchrun)."""
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(smoke_assets, output_dir), *FLAGS])
    return output_dir


@pytest.fixture(scope="module")
def stopped(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run sent SIGTERM in its second epoch, just after its first checkpoint appeared."""
    output_dir = tmp_path_factory.mktemp("stopped")
    log = output_dir.parent / "stopped.log"
    process = launch_until_first_checkpoint(smoke_assets, output_dir, log)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    returncode = wait(process, log, timeout=120)
    return {"output_dir": output_dir, "log": log.read_text(), "returncode": returncode,
            "seconds_to_exit": time.monotonic() - signalled, "process": process,
            "checkpoints": checkpoint_steps(output_dir), "files": sorted(p.name for p in output_dir.iterdir())}


def test_sigterm_ends_the_run_within_seconds_with_the_stop_status(stopped: dict) -> None:
    # torchrun kills workers 30 s after passing SIGTERM on; a stop must come well before that.
    assert stopped["seconds_to_exit"] < 30, stopped["log"][-3000:]
    assert stopped["returncode"] != 0, "a stopped run must not look finished"
    assert "stopped by SIGTERM at step" in stopped["log"]


def test_sigterm_saves_the_step_reached_mid_epoch(stopped: dict) -> None:
    first, *rest = stopped["checkpoints"]
    assert first == STEPS_PER_EPOCH and len(rest) == 1, stopped["checkpoints"]
    reached = rest[0]
    assert STEPS_PER_EPOCH < reached < 3 * STEPS_PER_EPOCH
    assert f"stopped by SIGTERM at step {reached}, saved in checkpoint-{reached}" in stopped["log"]


def test_sigterm_leaves_nothing_half_written_and_no_process(stopped: dict) -> None:
    assert [name for name in stopped["files"] if "tmp" in name] == []
    assert "metrics.json" not in stopped["files"], "the stopped run wrote final results"
    with pytest.raises(ProcessLookupError):
        os.killpg(stopped["process"].pid, 0)  # no process of its session is left


def test_the_same_command_resumes_and_ends_with_the_uninterrupted_weights(
    stopped: dict, uninterrupted: Path, smoke_assets: Path
) -> None:
    output_dir = stopped["output_dir"]
    log = output_dir.parent / "resumed.log"
    assert wait(launch([*smoke_flags(smoke_assets, output_dir), *FLAGS], log), log) == 0, log.read_text()[-3000:]
    assert f"checkpoint-{stopped['checkpoints'][-1]}" in log.read_text()  # it says where it resumed from
    expected, actual = (load_file(folder / "model.safetensors") for folder in (uninterrupted, output_dir))
    assert expected.keys() == actual.keys()
    worst = max((expected[name] - actual[name]).abs().max().item() for name in expected)
    assert worst <= WEIGHTS_ATOL, f"largest weight difference {worst:.3g} ({'native' if IS_NATIVE else 'Trainer'})"


def test_ctrl_c_stops_every_process_without_saving_and_says_so(smoke_assets: Path, tmp_path: Path) -> None:
    """Ctrl-C in a terminal sends SIGINT to the whole foreground process group; only SIGTERM saves."""
    output_dir, log = tmp_path / "out", tmp_path / "run.log"
    process = launch_until_first_checkpoint(smoke_assets, output_dir, log)
    os.killpg(process.pid, signal.SIGINT)
    assert wait(process, log, timeout=120) == 128 + signal.SIGINT
    assert checkpoint_steps(output_dir) == [STEPS_PER_EPOCH]
    assert ("torchrun: stopped by SIGINT; the workers stopped without saving (only SIGTERM saves): the same "
            "command resumes from the newest checkpoint") in log.read_text(), log.read_text()[-3000:]
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]  # that one line, not one per worker
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)


def test_after_a_stop_request_loader_workers_start_with_sigterm_held_and_other_forks_die_of_it() -> None:
    # Held from the fork, a loader worker survives a SIGTERM to every process until its worker_init_fn. Any
    # other fork (datasets' map workers, ended by Pool.terminate's SIGTERM) must die of it: neither held
    # nor caught by the StopRequest's handler, or the rank would wait for it forever.
    previous, (read, write) = signal.getsignal(signal.SIGTERM), os.pipe()
    package_module("stopping").StopRequest()
    try:

        def report(worker_id: int) -> None:
            os.write(write, b"1" if signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []) else b"0")

        loader = iter(DataLoader(range(2), batch_size=1, num_workers=1, worker_init_fn=report))
        next(loader)
        assert os.read(read, 1) == b"1"
        del loader
        pid = os.fork()
        if pid == 0:  # waits on the pipe, as a pool worker waits for tasks
            os.read(read, 1)
            os._exit(0)
        time.sleep(0.5)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while (ended := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if ended[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert ended[0] == pid and os.WIFSIGNALED(ended[1]) and os.WTERMSIG(ended[1]) == signal.SIGTERM
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.close(read)
        os.close(write)


def test_a_loader_worker_ignores_anyone_elses_sigterm_and_ends_on_its_parents() -> None:
    stopping = package_module("stopping")
    # A scheduler's SIGTERM to every process must not kill loader workers before the rank saves; their
    # rank's SIGTERM (multiprocessing's at exit, after any error) must end them, or the rank waits forever.
    before = {child.pid for child in psutil.Process().children()}
    batches = iter(DataLoader(range(8), batch_size=1, num_workers=1, worker_init_fn=stopping.keep_through_sigterm()))
    assert next(batches).tolist() == [0]  # the worker has run its worker_init_fn
    (worker,) = [child for child in psutil.Process().children() if child.pid not in before]
    subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)  # from another process, as SLURM sends it
    time.sleep(0.5)
    assert worker.status() != psutil.STATUS_ZOMBIE
    assert next(batches).tolist() == [1]
    os.kill(worker.pid, signal.SIGTERM)  # from its parent
    deadline = time.monotonic() + 5
    while worker.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.05)
    assert worker.status() == psutil.STATUS_ZOMBIE, "the worker ignored its parent's SIGTERM"
    del batches
