"""Shared fixtures and helpers: offline smoke assets, an isolated process for in-process tests, and real
launches as plain commands (torchrun: 2 CPU processes, gloo)."""

from __future__ import annotations

import importlib
import json
import operator
import os
import signal
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import datasets
import huggingface_hub.constants
import psutil
import pytest
import torch
import yaml
from datasets import Dataset, DatasetDict, Features

# What the launches of the tests give their processes (run_env), for the in-process tests too: one thread
# each, as pytest-xdist runs two test processes on two cores.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
# The one package under src/, found at run time so that this file is plain Python before rendering.
PACKAGE = next(path.parent.name for path in (REPO_ROOT / "src").glob("*/__init__.py"))
IS_NATIVE = (REPO_ROOT / "src" / PACKAGE / "checkpoint.py").is_file()  # the native loop's own module


def package_module(name: str):
    return importlib.import_module(f"{PACKAGE}.{name}")


def names_from(module: str, *names: str) -> tuple:
    """`from <package>.<module> import <names>`, for a package whose name conftest finds at run time."""
    return operator.attrgetter(*names)(package_module(module))


SMOKE_CONFIG = REPO_ROOT / "configs" / "smoke.yaml"
SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())
TRAIN_SIZE = 256  # divisible by 2 ranks x the smoke batch, so shards can be exactly disjoint
EVAL_SIZE = 101  # odd: a naive distributed eval would count one example twice
REQUIRED = ["--model_name_or_path", "some/model", "--train_file", "train.jsonl"]  # the least train.py accepts


@pytest.fixture(scope="session")
def smoke_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("smoke_assets")
    return package_module("smoke").make_smoke_assets(folder, train_size=TRAIN_SIZE, eval_size=EVAL_SIZE)


@pytest.fixture(scope="session")
def tiny_bigbird(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BigBird classifier with the smoke tokenizer: a real architecture whose classification forward
    never uses some of its trainable parameters (its pooler; the head reads the first token itself)."""
    from transformers import BigBirdConfig, BigBirdForSequenceClassification

    folder = tmp_path_factory.mktemp("tiny-bigbird")
    tokenizer = package_module("smoke").build_tokenizer()
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    # original_full: the block-sparse attention falls back to it anyway on inputs this short, with a warning.
    config = BigBirdConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=128, attention_type="original_full")
    BigBirdForSequenceClassification(config).save_pretrained(folder)
    return folder


# ---- in-process tests: one process, offline, nothing left behind ---------------------------------

@pytest.fixture
def isolated_process(monkeypatch: pytest.MonkeyPatch):
    """Offline, single-process, and no accelerate state left behind (the Trainer's device setup fills its
    process-wide PartialState; the native loop never uses accelerate). huggingface_hub reads HF_HUB_OFFLINE
    once, at import, so the constant itself is patched: a missing model then fails at once, not after ~20 s
    of retries."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    yield
    if not IS_NATIVE:  # the Trainer's device setup (accelerate)
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture
def datasets_cache_in_tmp_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
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
    """`torchrun --standalone --nproc_per_node=N <script | -m module> args`, as a plain command."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    result = finish(start([*command, *args], run_env()), timeout)
    if check and result.returncode != 0:
        pytest.fail(f"torchrun exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def run_python(args: list[str], timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python <script | -m module> args` as one plain process (no torchrun)."""
    return finish(start([sys.executable, *args], run_env() if env is None else env), timeout)


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
    config.addinivalue_line("markers", "slow: real launches beyond the one DDP run of `make test`; `make test-all` "
                                       "runs them too")


def versions_not_tested() -> list[str]:
    """Installed packages whose version differs from constraints.txt's, the versions these tests passed with."""
    lines = (REPO_ROOT / "constraints.txt").read_text().splitlines()
    tested = dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))
    different = []
    for name, version in tested.items():
        try:
            installed = metadata.version(name).split("+")[0]  # torch's +cpu: the same release
        except metadata.PackageNotFoundError:
            continue
        if installed != version:
            different.append(f"{name} {installed} (tested: {version})")
    return different


def pytest_report_header() -> str:
    different = versions_not_tested()
    return "versions: " + (", ".join(different) if different else "as in constraints.txt")


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:
    if exitstatus != 0 and (different := versions_not_tested()):
        terminalreporter.write_line(
            f"These tests passed with constraints.txt's versions; this environment differs: {', '.join(different)}. "
            "A failure may come from that change: `make install` brings back the tested versions.", yellow=True)
