"""Warm launches for the template's proofs: torchrun and python commands forked from the test process.

The proofs run dozens of real launches inside a copy of each render. Forked from the pytest process, a launch
starts with the imports it has already paid for (transformers, datasets, torch: some 6 s a process on 2 cores);
the render's own tests launch plain commands (its tests/conftest.py). Same names and signatures as there.
"""

from __future__ import annotations

import importlib
import logging
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial

import pytest
import torch
from conftest import REPO_ROOT, kill_tree, package_module, run_env


def torchrun(args: list[str], nproc: int = 2, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=N <script | -m module> args`, started warm (start_torchrun)."""
    result = start_torchrun(args, nproc).finish(timeout)
    if check and result.returncode != 0:
        pytest.fail(f"torchrun exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def start_torchrun(args: list[str], nproc: int = 2) -> WarmProcess:
    """Start `torchrun --standalone --nproc_per_node=N <script | -m module> args` warm (see warm_start).

    The agent, its rendezvous on a free port and the workers are torchrun's own; with `--run-path
    --start-method fork` (torchrun's options for a script run in the agent's interpreter) the workers
    are forked from it, so they start with this test process's imports. A module's workers are forked as
    the render's launcher forks them (its torchrun.py's fork_workers_from_here: they run its worker.py).
    The launcher's SIGTERM handling and one-line errors are tested through the launch scripts.
    """
    package_module("train")  # imported here once, so that every fork starts with it
    target = list(args) if args[0] == "-m" else ["--start-method", "fork", "--run-path", *args]
    argv = ["--standalone", f"--nproc_per_node={nproc}", *target]
    return warm_start(partial(torch_distributed_run_main, argv), run_env())


def torch_distributed_run_main(argv: list[str]) -> None:
    from torch.distributed import run

    run.main(package_module("torchrun").fork_workers_from_here(argv))


def run_python(args: list[str], timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python <script | -m module> args` as one plain process (no torchrun), started warm (see warm_start)."""
    if args[0] == "-m":
        importlib.import_module(args[1])  # imported here once, so that every fork starts with it
    return warm_start(partial(run_as_main, args), run_env() if env is None else env).finish(timeout)


def run_as_main(args: list[str]) -> None:
    """What `python <script | -m module> args` runs."""
    if args[0] == "-m":
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        runpy.run_path(args[0], run_name="__main__")


def warm_start(target: Callable[[], object], env: dict[str, str]) -> WarmProcess:
    """Run target in a fork of this test process, as a command in a session of its own.

    A fork starts with the imports this process has already paid for (transformers, datasets, torch:
    some 6 s a process on 2 cores), and otherwise as a fresh command would: its own environment, the
    repo as working directory, stdout and stderr of its own, default SIGTERM and SIGINT, no logging set
    up, torch's threads as OMP_NUM_THREADS says, exit status from SystemExit. It ends with os._exit, as
    multiprocessing's children do: atexit handlers are not run.
    """
    out, err = (tempfile.TemporaryFile(mode="w+") for _ in range(2))  # noqa: SIM115 - closed by WarmProcess
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            os.setsid()
            os.chdir(REPO_ROOT)
            os.environ.clear()
            os.environ.update(env)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # what a new process reads from it
            logging.root.handlers.clear()  # pytest's capture handlers
            logging.root.setLevel(logging.WARNING)
            target()
            status = 0
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if not isinstance(stop.code, int | None):
                print(stop.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported as a command reports it
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(status)
    return WarmProcess(pid, getattr(target, "args", ()), out, err)


class WarmProcess:
    """A command warm_start started: poll it, signal it, and finish it as conftest's finish does a Popen."""

    def __init__(self, pid: int, args: object, out, err) -> None:
        self.pid, self.args, self.out, self.err = pid, args, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def finish(self, timeout: float = 300) -> subprocess.CompletedProcess:
        """Wait for the exit (killing the whole session after timeout seconds, and failing the test)."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                kill_tree(self.pid)
                os.waitpid(self.pid, 0)
                pytest.fail(f"{self.args} timed out after {timeout}s:\n{self.read(self.out)[-3000:]}\n"
                            f"{self.read(self.err)[-3000:]}")
            time.sleep(0.02)
        return subprocess.CompletedProcess(self.args, self.returncode, self.read(self.out), self.read(self.err))

    @staticmethod
    def read(stream) -> str:
        stream.seek(0)
        text = stream.read()
        stream.close()
        return text
