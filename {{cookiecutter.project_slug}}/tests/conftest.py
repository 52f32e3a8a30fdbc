"""Shared fixtures: offline smoke assets and a real torchrun launcher (2 CPU processes, gloo)."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
# The one package under src/, found at run time so that this file is plain Python before rendering.
PACKAGE = next(path.parent.name for path in (REPO_ROOT / "src").glob("*/__init__.py"))
IS_NATIVE = (REPO_ROOT / "src" / PACKAGE / "checkpoint.py").is_file()  # the native loop's own module


def package_module(name: str):
    """Import <package>.<name>, e.g. package_module("train")."""
    return importlib.import_module(f"{PACKAGE}.{name}")


SMOKE_CONFIG = REPO_ROOT / "configs" / "smoke.yaml"
SMOKE = yaml.safe_load(SMOKE_CONFIG.read_text())
TRAIN_SIZE = 256  # divisible by 2 ranks x the smoke batch, so shards can be exactly disjoint
EVAL_SIZE = 101  # odd: a naive distributed eval would count one example twice


@pytest.fixture(scope="session")
def smoke_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("smoke_assets")
    return package_module("smoke").make_smoke_assets(folder, train_size=TRAIN_SIZE, eval_size=EVAL_SIZE)


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


def finish(process: subprocess.Popen, timeout: int = 300) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # torchrun starts its workers in sessions of their own: kill the whole tree, or they would
        # keep the pipes open and communicate() would wait for ever.
        for child in psutil.Process(process.pid).children(recursive=True):
            child.kill()
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"{process.args[:4]} timed out after {timeout}s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def torchrun(args: list[str], nproc: int = 2, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Launch with torchrun itself; --standalone gives every run its own free port."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    result = finish(start(command, run_env()), timeout)
    if check and result.returncode != 0:
        pytest.fail(f"torchrun exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: starts a real SLURM cluster (root; installs slurm-wlm if missing)")
