"""The launch scripts in scripts/: help text, the torchrun command they build, and bad settings.

No test here starts torchrun. PYTHON points at a recorder that writes down how it was called, so
each test reads the exact command a script would have run, or proves that nothing was run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
SLURM_SCRIPT = SCRIPTS / "train_slurm.sbatch"  # absent when the project was generated without SLURM
PACKAGE_NAME = next(p.name for p in sorted((REPO_ROOT / "src").iterdir()) if (p / "__init__.py").is_file())
CPU_COUNT = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

# Settings a developer's shell (or a CI job running inside SLURM) may hold; each test starts without them.
LAUNCH_VARIABLES = (
    "NPROC_PER_NODE",
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MAX_RESTARTS",
    "OMP_NUM_THREADS",
    "PYTHON",
)

needs_slurm_script = pytest.mark.skipif(not SLURM_SCRIPT.exists(), reason="generated without the SLURM script")

RECORDER = """\
import json, os, sys
with open(os.environ["RECORD_FILE"], "a") as record:
    record.write(json.dumps({
        "program": os.path.basename(sys.argv[1]),
        "argv": sys.argv[2:],
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }) + "\\n")
if sys.argv[2:3] == ["-c"]:  # the GPU count asked for by NPROC_PER_NODE=auto
    print(os.environ.get("FAKE_GPU_COUNT", "0"))
"""


class Launcher:
    """Runs the scripts with a recording PYTHON (and fake srun/scontrol) in a clean environment."""

    def __init__(self, tmp_path: Path) -> None:
        self.record_file = tmp_path / "calls.jsonl"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        recorder = tmp_path / "recorder.py"
        recorder.write_text(RECORDER)
        for name in ("python", "srun"):
            self._write_executable(name, f'#!/bin/sh\nexec "{sys.executable}" "{recorder}" "$0" "$@"\n')
        self._write_executable("scontrol", "#!/bin/sh\nprintf 'node1\\nnode2\\n'\n")
        self.env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES and not k.startswith("SLURM_")}
        self.env.update(PYTHON=str(self.bin / "python"), RECORD_FILE=str(self.record_file))
        self.env["PATH"] = f"{self.bin}{os.pathsep}{self.env.get('PATH', '')}"

    def _write_executable(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text(text)
        path.chmod(0o755)

    def run(self, script: str | Path, *args: str, **env: str | None) -> subprocess.CompletedProcess:
        full_env = dict(self.env)
        for name, value in env.items():
            if value is None:
                full_env.pop(name, None)
            else:
                full_env[name] = value
        script_path = script if isinstance(script, Path) else SCRIPTS / script
        return subprocess.run(
            ["bash", str(script_path), *args],
            check=False,
            cwd=REPO_ROOT,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def calls(self) -> list[dict]:
        if not self.record_file.exists():
            return []
        return [json.loads(line) for line in self.record_file.read_text().splitlines()]

    def launch_call(self) -> dict:
        """The one call that would have started torchrun (the GPU count call left out)."""
        launches = [call for call in self.calls() if call["argv"][:1] != ["-c"]]
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

COMMON_HELP_WORDS = ["NPROC_PER_NODE", "MAX_RESTARTS", "OMP_NUM_THREADS", "PYTHON"]
HELP_WORDS = {
    "train_single_node.sh": COMMON_HELP_WORDS,
    "train_multi_node.sh": COMMON_HELP_WORDS
    + ["NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NCCL_DEBUG=INFO", "NCCL_SOCKET_IFNAME"],
    "train_slurm.sbatch": COMMON_HELP_WORDS + ["MASTER_PORT", "sbatch"],
}


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize("script", sorted(HELP_WORDS))
def test_help_lists_the_environment_and_starts_nothing(launcher: Launcher, script: str, flag: str) -> None:
    if not (SCRIPTS / script).exists():
        pytest.skip(f"{script} was not generated")
    result = launcher.run(script, flag)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage:")
    for word in HELP_WORDS[script]:
        assert word in result.stdout, f"{word} missing from {script} {flag}"
    assert launcher.calls() == []


# (script, environment, arguments, text the one-line error must hold)
BAD_SETTINGS = [
    pytest.param("train_single_node.sh", {"NPROC_PER_NODE": "0"}, [], "NPROC_PER_NODE", id="nproc-zero"),
    pytest.param("train_single_node.sh", {"NPROC_PER_NODE": "many"}, [], "NPROC_PER_NODE", id="nproc-word"),
    pytest.param(
        "train_single_node.sh", {"NPROC_PER_NODE": "1", "MAX_RESTARTS": "x"}, [], "MAX_RESTARTS", id="max-restarts-word"
    ),
    pytest.param(
        "train_single_node.sh",
        {"NPROC_PER_NODE": "1", "MAX_RESTARTS": "-1"},
        [],
        "MAX_RESTARTS",
        id="max-restarts-negative",
    ),
    pytest.param(
        "train_single_node.sh",
        {"NPROC_PER_NODE": "1"},
        ["configs/missing.yaml", "--seed", "1"],
        "configs/missing.yaml",
        id="single-missing-config",
    ),
    pytest.param(
        "train_single_node.sh", {"NPROC_PER_NODE": "1", "PYTHON": "/no/such/python"}, [], "PYTHON", id="python-missing"
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "NODE_RANK": "2"}, [], "NODE_RANK", id="node-rank-equals-nnodes"
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "NODE_RANK": "-1"}, [], "NODE_RANK", id="node-rank-negative"
    ),
    pytest.param("train_multi_node.sh", {**MULTI_NODE_ENV, "NODE_RANK": None}, [], "NODE_RANK", id="node-rank-unset"),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "MASTER_ADDR": None}, [], "MASTER_ADDR", id="master-addr-unset"
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "MASTER_ADDR": ""}, [], "MASTER_ADDR", id="master-addr-empty"
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "MASTER_PORT": "80"}, [], "MASTER_PORT", id="master-port-privileged"
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "MASTER_PORT": "65536"}, [], "MASTER_PORT", id="master-port-too-high"
    ),
    pytest.param("train_multi_node.sh", {**MULTI_NODE_ENV, "NNODES": "0"}, [], "NNODES", id="nnodes-zero"),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "NPROC_PER_NODE": "0"}, [], "NPROC_PER_NODE", id="multi-nproc-zero"
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "MAX_RESTARTS": "x"}, [], "MAX_RESTARTS", id="multi-max-restarts-word"
    ),
    pytest.param(
        "train_multi_node.sh",
        MULTI_NODE_ENV,
        ["configs/missing.json"],
        "configs/missing.json",
        id="multi-missing-config",
    ),
    pytest.param(
        "train_slurm.sbatch",
        {"NPROC_PER_NODE": "1"},
        [],
        "SLURM_JOB_ID",
        id="slurm-outside-a-job",
        marks=needs_slurm_script,
    ),
    pytest.param(
        "train_slurm.sbatch",
        {**SLURM_ENV, "MASTER_PORT": "80"},
        [],
        "MASTER_PORT",
        id="slurm-master-port",
        marks=needs_slurm_script,
    ),
    pytest.param(
        "train_slurm.sbatch",
        SLURM_ENV,
        ["configs/missing.yml"],
        "configs/missing.yml",
        id="slurm-missing-config",
        marks=needs_slurm_script,
    ),
]


@pytest.mark.parametrize(("script", "env", "args", "named"), BAD_SETTINGS)
def test_bad_setting_stops_with_one_line_naming_it_before_torchrun(
    launcher: Launcher, script: str, env: dict, args: list, named: str
) -> None:
    result = launcher.run(script, *args, **env)
    assert result.returncode == 1
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1, result.stderr
    assert error_lines[0].startswith("error: ")
    assert named in error_lines[0]
    assert launcher.calls() == [], "torchrun (or the GPU count) ran despite the bad setting"


def test_single_node_runs_standalone_torchrun_with_config_and_flags(launcher: Launcher, config_file: str) -> None:
    result = launcher.run(
        "train_single_node.sh",
        config_file,
        "--learning_rate",
        "3e-5",
        "--run_name",
        "two words",
        NPROC_PER_NODE="3",
        MAX_RESTARTS="2",
    )
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["program"] == "python"
    assert call["argv"] == [
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=3",
        "--max-restarts=2",
        "-m",
        f"{PACKAGE_NAME}.train",
        config_file,
        "--learning_rate",
        "3e-5",
        "--run_name",
        "two words",
    ]


def test_src_is_first_on_pythonpath_so_a_checkout_runs_uninstalled(launcher: Launcher) -> None:
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="1", PYTHONPATH="/elsewhere")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT / "src"), "/elsewhere"]


def test_multi_node_runs_static_rendezvous_on_master_addr(launcher: Launcher, config_file: str) -> None:
    result = launcher.run("train_multi_node.sh", config_file, "--seed", "7", **MULTI_NODE_ENV, MASTER_PORT="29123")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["argv"] == [
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=29123",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "-m",
        f"{PACKAGE_NAME}.train",
        config_file,
        "--seed",
        "7",
    ]


@pytest.mark.parametrize(
    ("gpu_count", "expected_nproc"),
    [("4", 4), ("1", 1), ("0", 2 if CPU_COUNT >= 2 else 1)],
    ids=["four-gpus", "one-gpu", "cpu-only"],
)
def test_auto_starts_one_process_per_gpu_or_two_on_cpu(launcher: Launcher, gpu_count: str, expected_nproc: int) -> None:
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="auto", FAKE_GPU_COUNT=gpu_count)
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert f"--nproc-per-node={expected_nproc}" in call["argv"]
    assert call["OMP_NUM_THREADS"] == str(max(1, CPU_COUNT // expected_nproc))


def test_auto_finding_no_gpu_inside_a_slurm_job_is_refused(launcher: Launcher) -> None:
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="auto", FAKE_GPU_COUNT="0", SLURM_JOB_ID="42")
    assert result.returncode == 1
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: NPROC_PER_NODE=auto found no GPU in this SLURM job")
    assert [call for call in launcher.calls() if call["argv"][:1] != ["-c"]] == []


def test_omp_num_threads_set_by_the_user_is_kept(launcher: Launcher) -> None:
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="2", OMP_NUM_THREADS="7")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["OMP_NUM_THREADS"] == "7"


@needs_slurm_script
def test_slurm_runs_one_torchrun_per_node_meeting_on_the_first_node(
    launcher: Launcher, config_file: str, tmp_path: Path
) -> None:
    # sbatch runs a copy of the script from its spool folder: the repo must be found via SLURM_SUBMIT_DIR.
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(SLURM_SCRIPT, spool / "slurm_script")
    result = launcher.run(
        spool / "slurm_script",
        config_file,
        "--seed",
        "7",
        **SLURM_ENV,
        SLURM_SUBMIT_DIR=str(REPO_ROOT),
        SLURM_CPUS_PER_TASK="8",
        MASTER_PORT="29123",
    )
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["program"] == "srun"
    assert call["argv"] == [
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--cpus-per-task=8",
        str(launcher.bin / "python"),
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-id=4242",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node1:29123",
        "--max-restarts=0",
        "-m",
        f"{PACKAGE_NAME}.train",
        config_file,
        "--seed",
        "7",
    ]


def test_scripts_parse_in_bash() -> None:
    for script in sorted(SCRIPTS.iterdir()):
        result = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_scripts_pass_shellcheck() -> None:
    scripts = [str(p.relative_to(REPO_ROOT)) for p in sorted(SCRIPTS.iterdir())]
    result = subprocess.run(["shellcheck", "-x", *scripts], cwd=REPO_ROOT, check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
