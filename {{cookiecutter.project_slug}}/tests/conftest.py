"""Shared fixtures and helpers: offline smoke assets, an isolated process for in-process tests, and a
real torchrun launcher (2 CPU processes, gloo)."""

from __future__ import annotations

import importlib
import json
import logging
import operator
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import datasets
import huggingface_hub.constants
import psutil
import pytest
import torch
import yaml
from accelerate.state import AcceleratorState
from datasets import Dataset, DatasetDict, Features

# What the launches of the tests give their processes (run_env), for this process too: the warm launches
# are forks of it (warm_start), and a tokenizer or an OpenMP pool that ran threads here would not survive one.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
# The one package under src/, found at run time so that this file is plain Python before rendering.
PACKAGE = next(path.parent.name for path in (REPO_ROOT / "src").glob("*/__init__.py"))
IS_NATIVE = (REPO_ROOT / "src" / PACKAGE / "checkpoint.py").is_file()  # the native loop's own module


def package_module(name: str):
    """Import <package>.<name>, e.g. package_module("train")."""
    return importlib.import_module(f"{PACKAGE}.{name}")


def names_from(module: str, *names: str) -> tuple:
    """`from <package>.<module> import <names>`, for a package whose name conftest finds at run time."""
    return operator.attrgetter(*names)(package_module(module))


SMOKE_CONFIG = REPO_ROOT / "configs" / "smoke.yaml"
SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())
TRAIN_SIZE = 256  # divisible by 2 ranks x the smoke batch, so shards can be exactly disjoint
EVAL_SIZE = 101  # odd: a naive distributed eval would count one example twice
RUN_MODULE = REPO_ROOT / "tests" / "run_module.py"  # torchrun --run-path runs a script: this one runs a module
REQUIRED = ["--model_name_or_path", "some/model", "--train_file", "train.jsonl"]  # the least train.py accepts


@pytest.fixture(scope="session")
def smoke_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("smoke_assets")
    return package_module("smoke").make_smoke_assets(folder, train_size=TRAIN_SIZE, eval_size=EVAL_SIZE)


# ---- in-process tests: one process, offline, nothing left behind ---------------------------------

@pytest.fixture
def isolated_process(monkeypatch: pytest.MonkeyPatch):
    """Offline, single-process, and no accelerate state left behind for the next test or module.

    huggingface_hub reads HF_HUB_OFFLINE once, at import, so the constant itself is patched: a
    missing model path then fails at once instead of retrying the Hub for ~20 s.

    Parsing leaves no state (training_args.py), but a Trainer's device setup, at the first use of
    `args.device`, fills accelerate's process-wide PartialState. The tests cannot leak into each other
    through it (transformers resets that state before every device setup), but the state would outlive
    the module, so it is reset after each test.
    """
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture
def datasets_cache_in_tmp_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """datasets caches the files it reads (predict's and train's own loading) in the test's tmp_path."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets_cache")


def parse_args(argv: list[str]) -> tuple:
    """(model, data, training) arguments, parsed as this project's train.py parses them."""
    return package_module("config").parse_args(package_module("training_args").TrainingArguments, argv)


def in_memory(train_labels: list, validation_labels: list, features: Features | None = None) -> DatasetDict:
    """Train and validation splits of a text column ("good" 1 to 5 times) and these labels."""
    def split(labels: list) -> Dataset:
        texts = [" ".join(["good"] * (i % 5 + 1)) for i in range(len(labels))]
        return Dataset.from_dict(dict(text=texts, label=labels), features=features)
    return DatasetDict(train=split(train_labels), validation=split(validation_labels))


def task_of(*names: str, **inputs) -> object:
    """A single-label Task over these label names (data.Task)."""
    return package_module("data").Task("single_label_classification", list(names), **inputs)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- runs: flags, launchers and what they leave behind -------------------------------------------

def smoke_flags(assets: Path, output_dir: Path) -> list[str]:
    """configs/smoke.yaml, pointed at the test's own assets and output folder."""
    return [
        str(SMOKE_CONFIG),
        "--model_name_or_path", str(assets / "tiny-bert"),
        "--train_file", str(assets / "train.jsonl"),
        "--validation_file", str(assets / "validation.jsonl"),
        "--output_dir", str(output_dir),
        "--disable_tqdm", "true",
    ]


def run_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT / "src"), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHON"] = sys.executable  # the launch scripts run this interpreter, not whatever python is on PATH
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def start(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start a launcher in its own process group, so a timeout can stop its workers too."""
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def kill_tree(pid: int) -> None:
    """Kill a command started in a session of its own, and every process under it. torchrun starts its
    workers in sessions of their own: killing the session alone would leave them, holding the pipes open."""
    for child in psutil.Process(pid).children(recursive=True):
        child.kill()
    os.killpg(pid, signal.SIGKILL)


def finish(process: subprocess.Popen, timeout: int = 300) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(process.pid)
        stdout, stderr = process.communicate()
        pytest.fail(f"{process.args[:4]} timed out after {timeout}s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


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
    are forked from it, so they start with this test process's imports. `python -m torch.distributed.run`
    starting `python -m <module>` workers, as the launch scripts do, is tested through the scripts.
    """
    package_module("train")  # imported here once, so that every fork starts with it
    target = ["--run-path", str(RUN_MODULE), *args[1:]] if args[0] == "-m" else ["--run-path", *args]
    argv = ["--standalone", f"--nproc_per_node={nproc}", "--start-method", "fork", *target]
    return warm_start(partial(torch_distributed_run_main, argv), run_env())


def torch_distributed_run_main(argv: list[str]) -> None:
    from torch.distributed import run

    run.main(argv)


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_metrics(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.json").read_text())


def read_probe(output_dir: Path, ranks: int = 2) -> list[dict]:
    """The record tests/ddp_probe.py wrote for each rank."""
    return [json.loads((output_dir / "probe" / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: starts a real SLURM cluster (root; installs slurm-wlm if missing)")
    config.addinivalue_line("markers", "slow: real launches beyond the one DDP run of `make test`; `make test-all` "
                                       "runs them too")


# The template this project came from runs its real-SLURM proofs inside a copy of it, with this file; each
# of these modules starts a SLURM cluster. This project ships none of them.
SLURM_MODULES = ("tests/test_slurm.py", "tests/test_slurm_cluster.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every SLURM test is slow. The modules run longest first: the SLURM ones, then those with real
    launches, then the unit tests (for pytest-xdist workers to finish together, see
    pytest_xdist_make_scheduler); a module keeps its own order."""
    for item in items:
        if item.get_closest_marker("slurm") is not None:  # a SLURM cluster starts in tens of seconds
            item.add_marker(pytest.mark.slow)
    launches = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (0 if item.get_closest_marker("slurm") else 1 if item.path in launches else 2))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which `make test` and `make test-all` run
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Each worker takes whole modules, so that a module's expensive runs (its module fixtures) happen once,
    in the order pytest_collection_modifyitems gives them; both SLURM modules go to the same worker, so that
    one SLURM cluster at a time runs on this host."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "slurm" if module in SLURM_MODULES else module

    config.option.loadscopereorder = False  # the order above, not by the number of tests
    return ModuleScheduling(config, log)
