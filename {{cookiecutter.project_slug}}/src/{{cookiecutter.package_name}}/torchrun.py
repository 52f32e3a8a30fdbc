"""torchrun as the launch scripts run it: `python -m <package>.torchrun ARGS` is `torchrun ARGS`, but the
workers of `-m MODULE` are forked from this process once it has imported MODULE (and run the preflight),
and a SIGTERM (preemption, a time limit, an eviction) ends the run with one line and an exit status that
say whether the workers saved, not with torchrun's 30-line traceback. (With torch older than 2.9, or no
/proc, torchrun handles SIGTERM itself once its workers start.)
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .compat import clear_exit_handlers, run_exit_handlers

# Exit status of a run that stopped on SIGTERM after writing its checkpoint: 128 + SIGTERM, as if
# killed by it, so that neither torchrun nor a scheduler mistakes it for a finished run.
STOPPED_EXIT_CODE = 128 + signal.SIGTERM


@dataclass(frozen=True)
class TorchrunEnv:
    """Which process this is, as torchrun's environment says (the one place the project reads it); a process
    torchrun did not start is rank 0 of 1."""

    rank: int = 0  # 0 .. world_size - 1, over all nodes
    local_rank: int = 0  # on this node: the GPU this process drives
    world_size: int = 1
    local_world_size: int = 1  # processes on this node
    node_rank: int = 0  # torchrun's GROUP_RANK
    started: bool = False  # whether torchrun started this process (it sets LOCAL_RANK)

    @classmethod
    def read(cls) -> TorchrunEnv:
        env = os.environ
        return cls(*(int(env.get(name, default)) for name, default in (
            ("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_WORLD_SIZE", 1), ("GROUP_RANK", 0))),
            started="LOCAL_RANK" in env)

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    # First of all, before torch takes seconds to import: a process killed by SIGTERM ends with the
    # same status (143) as workers that saved, and srun and train_slurm.sbatch could not tell them apart.
    if Path("/proc").is_dir():  # where stop_workers can find the workers
        signal.signal(signal.SIGTERM, stop_workers)
    run_torchrun(fork_workers_from_here(argv))


def end_after_sigterm(statuses: dict[int, int | None]) -> NoReturn:
    """End the launcher after a SIGTERM, saying from how each worker ended (its exit status, or None if
    still running) whether they all saved the step they reached."""
    if not statuses:
        raise SystemExit("torchrun: stopped by SIGTERM before any worker started: nothing was saved")
    if all(status == 0 for status in statuses.values()):  # it came as the training ended
        print(f"torchrun: SIGTERM came as the run ended: all {len(statuses)} worker(s) here had finished it "
              "(exit status 0)", file=sys.stderr)
        raise SystemExit(0)
    unsaved = [f"{pid} ({describe(status)})" for pid, status in statuses.items()
               if status != STOPPED_EXIT_CODE]
    if unsaved:
        raise SystemExit(f"torchrun: stopped by SIGTERM, but worker(s) {', '.join(unsaved)} did not save the "
                         "step they reached (exit status 143 means saved): the same command resumes from the "
                         "last checkpoint")
    print(f"torchrun: stopped by SIGTERM: all {len(statuses)} worker(s) here saved the step they reached; "
          "the same command resumes there", file=sys.stderr)
    raise SystemExit(STOPPED_EXIT_CODE)


def fork_workers_from_here(argv: list[str]) -> list[str]:
    """torchrun's ARGS with `-m MODULE ARGS` rewritten to fork the workers (and their restarts) from this
    process: `--run-path --start-method fork` with worker.py as the script. A script, or --no-python, stays."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # GPUs counted through NVML, not CUDA
    import torch
    from torch.distributed.run import parse_args

    args = parse_args(argv)
    if not args.module or args.run_path or args.no_python:
        return argv
    importlib.import_module(args.training_script)
    if "PREFLIGHT_WORLD_SIZE" in os.environ and args.training_script == f"{__package__}.train":
        run_preflight(args.training_script_args)
    if torch.cuda.is_initialized():
        raise SystemExit(f"error: {__package__}.torchrun initialised CUDA before forking the workers, which "
                         "would then fail to use their GPUs: nothing was started")
    # What is imported by now lasts as long as the workers: frozen, their full collections skip it (up to a
    # second at the end of a run), and the memory pages they share with this process stay shared.
    gc.freeze()
    script_at = len(argv) - len(args.training_script_args) - 1  # MODULE, after torchrun's own options
    options = [arg for arg in argv[:script_at] if arg not in ("-m", "--module")]
    worker = str(Path(__file__).with_name("worker.py"))
    flush_output()  # or each fork would write this process's buffered lines again
    return [*options, "--run-path", "--start-method=fork", worker, *argv[script_at:]]


_preflight_pid: int | None = None  # while the preflight runs: stop_workers ends it


def run_preflight(train_args: list[str]) -> None:
    """`python -m <package>.preflight ARGS` in a fork: what it touches (CUDA, for the Trainer's arguments; the
    logging set-up) stays out of the process the workers are forked from. A bad setting ends here."""
    global _preflight_pid
    flush_output()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            run_module([f"{__package__}.preflight", *train_args])
            status = 0
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
        finally:
            flush_output()
            os._exit(status)
    _preflight_pid = pid
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    _preflight_pid = None
    if status == 2:  # a bad setting: the preflight printed its error line
        raise SystemExit(2)
    if status != 0:
        raise SystemExit(f"error: the preflight check ({__package__}.preflight) failed with status {status}: "
                         "nothing was started")


def run_module(argv: list[str]) -> None:
    """Run `python -m MODULE ARGS` (argv: MODULE ARGS) in a fork of this launcher (a worker, the preflight),
    as a new process would: in a session of its own (as torchrun starts a command: a SIGTERM for the worker
    reaches its loader workers), with default signal handlers, no logging set up, none of the launcher's
    exit handlers, output written line by line (`python -u`), torch's threads as OMP_NUM_THREADS says.
    An exception is printed and ends it with status 1, Ctrl-C quietly with 130; SystemExit(0) returns
    (torchrun waits for a worker's return value). Its exit handlers run at its end (a fork skips them)."""
    import logging
    import runpy
    import traceback
    import warnings

    import torch

    os.setsid()
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.root.handlers.clear()
    logging.root.setLevel(logging.WARNING)
    clear_exit_handlers()
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.argv = list(argv)
    try:
        with warnings.catch_warnings():  # that MODULE was imported before it runs: on purpose
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    except KeyboardInterrupt:  # Ctrl-C: this launcher prints the one line that says what stopped
        raise SystemExit(128 + signal.SIGINT) from None
    except BaseException:  # noqa: BLE001 - reported as a command reports it
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        run_exit_handlers()


def flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


def run_torchrun(argv: list[str]) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig
    from torch.distributed.run import main as torchrun

    if signal.getsignal(signal.SIGTERM) is stop_workers and hasattr(LaunchConfig, "signals_to_handle"):
        argv = ["--signals-to-handle=SIGINT,SIGHUP,SIGQUIT", *argv]  # SIGTERM stays stop_workers'
    try:
        torchrun(argv)
    except SignalException as stop:  # torchrun's own handling, SIGTERM's too on torch < 2.9: passed on
        saving = ("the workers were asked to save the step they reached (their last log lines say "
                  "whether they did)" if stop.sigval == signal.SIGTERM else "the workers stopped without "
                  "saving (only SIGTERM saves): the same command resumes from the newest checkpoint")
        print(f"torchrun: stopped by {stop.sigval.name}; {saving}", file=sys.stderr)
        raise SystemExit(128 + stop.sigval) from None
    except ChildFailedError as failed:
        if failed.get_first_failure()[1].exitcode == 2:  # a bad setting, which the workers printed
            raise SystemExit(2) from None
        if any(failure.exitcode != STOPPED_EXIT_CODE for failure in failed.failures.values()):
            raise
        print("torchrun: the workers stopped on SIGTERM and saved the step they reached; the same command "
              "resumes there", file=sys.stderr)
        raise SystemExit(STOPPED_EXIT_CODE) from None


def stop_workers(signum: int, frame: object) -> None:
    """SIGTERM: to each worker's process group, as torchrun sends it; then wait for the workers, up to
    TORCH_ELASTIC_SHUTDOWN_TIMEOUT (torchrun's own wait)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough: the workers are stopping
    if _preflight_pid is not None:  # no worker started yet
        with contextlib.suppress(ProcessLookupError):
            os.kill(_preflight_pid, signal.SIGKILL)
        end_after_sigterm({})
    workers = child_pids()
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)  # torchrun starts each worker in a session of its own
    deadline = time.monotonic() + int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
    end_after_sigterm({pid: exit_status(pid, deadline) for pid in workers})


def child_pids() -> list[int]:
    """This process's children, from /proc (each /proc/PID/stat holds the parent's PID)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):  # a process that ended meanwhile
            if stat.read_text().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
                children.append(int(stat.parent.name))
    return children


def exit_status(pid: int, deadline: float) -> int | None:
    """A child's exit status once it has exited (-N if signal N killed it, as subprocess says: a worker the
    SIGTERM killed before it set its handler did not save), or None at the deadline. WNOWAIT leaves the
    child for torchrun to reap, as it expects to."""
    while time.monotonic() < deadline:
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return None  # reaped already: not known
        if info is not None:
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        time.sleep(0.05)
    return None


def describe(status: int | None) -> str:
    if status is None:
        return "still running"
    return f"killed by {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"


def exit_now(code: int | str | None) -> None:
    """End this process as sys.exit(code) does, but for the interpreter's teardown of torch and transformers
    (over a second on 2 CPU cores, freeing what the exit frees anyway); the exit handlers run as usual."""
    run_exit_handlers()
    with contextlib.suppress(OSError):  # a reader that went away (`| head`) takes no more output
        if isinstance(code, str):
            print(code, file=sys.stderr)
        flush_output()
    os._exit(code if isinstance(code, int) else int(code is not None))


if __name__ == "__main__":
    try:
        main()
    except SystemExit as stop:  # the run's end, a stop on SIGTERM, a bad setting; a traceback exits as usual
        exit_now(stop.code)
    exit_now(0)
