"""The launch scripts in scripts/: help text, the torchrun command they build, and bad settings.

No test here starts torchrun. PYTHON, srun and scontrol point at a recorder that writes down how it
was called, so each test reads the exact command a script would have run, or proves that nothing was
run. No test needs SLURM, a GPU or the network.
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
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "RDZV_BACKEND",
    "RDZV_ENDPOINT",
    "RDZV_ID",
    "LOCAL_ADDR",
    "MODULE",
)

needs_slurm_script = pytest.mark.skipif(not SLURM_SCRIPT.exists(), reason="generated without the SLURM script")

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
elif sys.argv[3:4] and sys.argv[3].endswith(".preflight"):  # python -m <package>.preflight
    if os.environ.get("FAKE_PREFLIGHT_STATUS") == "2":  # a bad setting; other statuses are crashes
        sys.stderr.write("error: --learning_rate: a bad value\\n")
    sys.exit(int(os.environ.get("FAKE_PREFLIGHT_STATUS", "0")))
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
            self._write_executable(name, f'#!/bin/sh\nexec "{sys.executable}" "{recorder}" "$0" "$@"\n')
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

    def preflight_calls(self) -> list[dict]:
        return [call for call in self.calls() if call["argv"][:2] == ["-m", f"{PACKAGE_NAME}.preflight"]]

    def launch_call(self) -> dict:
        """The one call that would have started torchrun (GPU count, preflight and scontrol calls left out)."""
        launches = [call for call in self.calls() if call["argv"][:1] != ["-c"] and call["program"] != "scontrol"
                    and call not in self.preflight_calls()]
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

COMMON_HELP_WORDS = [
    "NPROC_PER_NODE",
    "MAX_RESTARTS",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "OMP_NUM_THREADS",
    "PYTHON",
    "MODULE",
    f"{PACKAGE_NAME}.doctor",
]
HELP_WORDS = {
    "train_single_node.sh": COMMON_HELP_WORDS,
    "train_multi_node.sh": COMMON_HELP_WORDS
    + ["NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS=1"]
    + ["RDZV_BACKEND", "c10d", "static", "RDZV_ENDPOINT", "RDZV_ID", "MIN:MAX", "LOCAL_ADDR", "pytorch/pytorch#135712"]
    + ["--ddp_timeout", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME"],
    "train_slurm.sbatch": COMMON_HELP_WORDS + ["MASTER_PORT", "sbatch"],
}
# torchrun already sets it, and 3 (not 1) is the default: advice to set it to 1 does nothing.
USELESS_HELP_WORDS = ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]


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
    for word in USELESS_HELP_WORDS:
        assert word not in result.stdout, f"{script} {flag} still advises {word}"
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
    pytest.param(
        "train_multi_node.sh",
        {**MULTI_NODE_ENV, "RDZV_BACKEND": "static", "NODE_RANK": None},
        [],
        "NODE_RANK",
        id="static-node-rank-unset",
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "NNODES": "2:4", "NODE_RANK": "4"}, [], "NODE_RANK",
        id="node-rank-beyond-max-nodes",
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "RDZV_BACKEND": "etcd"}, [], "RDZV_BACKEND", id="rdzv-backend-unknown"
    ),
    pytest.param("train_multi_node.sh", {**MULTI_NODE_ENV, "NNODES": "3:2"}, [], "NNODES", id="nnodes-range-reversed"),
    pytest.param("train_multi_node.sh", {**MULTI_NODE_ENV, "NNODES": "0:2"}, [], "NNODES", id="nnodes-range-from-zero"),
    pytest.param("train_multi_node.sh", {**MULTI_NODE_ENV, "NNODES": "2:"}, [], "NNODES", id="nnodes-range-open"),
    pytest.param(
        "train_multi_node.sh",
        {**MULTI_NODE_ENV, "RDZV_BACKEND": "static", "NNODES": "1:2"},
        [],
        "RDZV_BACKEND=c10d",
        id="static-nnodes-range",
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "RDZV_ID": "my job"}, [], "RDZV_ID", id="rdzv-id-with-space"
    ),
    pytest.param(
        "train_multi_node.sh",
        {**MULTI_NODE_ENV, "RDZV_BACKEND": "static", "MASTER_ADDR": None, "RDZV_ENDPOINT": "store:29400"},
        [],
        "MASTER_ADDR",
        id="static-ignores-rdzv-endpoint",
    ),
    pytest.param(
        "train_single_node.sh", {"NPROC_PER_NODE": "1", "MODULE": "train.py"}, [], "MODULE", id="module-file-name"
    ),
    pytest.param(
        "train_multi_node.sh", {**MULTI_NODE_ENV, "MODULE": "-c"}, [], "MODULE", id="multi-module-option"
    ),
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
    pytest.param(
        "train_slurm.sbatch",
        {**SLURM_ENV, "SLURM_JOB_NODELIST": None},
        [],
        "SLURM_JOB_NODELIST",
        id="slurm-nodelist-unset",
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
        f"{PACKAGE_NAME}.torchrun",
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


def test_the_preflight_checks_the_same_arguments_for_the_whole_world_size_first(
    launcher: Launcher, config_file: str
) -> None:
    result = launcher.run("train_single_node.sh", config_file, "--seed", "3", NPROC_PER_NODE="3")
    assert result.returncode == 0, result.stderr
    calls = [call for call in launcher.calls() if call["argv"][:1] != ["-c"]]
    assert [call["argv"][1] for call in calls] == [f"{PACKAGE_NAME}.preflight", f"{PACKAGE_NAME}.torchrun"]
    assert calls[0]["argv"][2:] == [config_file, "--seed", "3"]
    assert calls[0]["PREFLIGHT_WORLD_SIZE"] == "3"


@needs_slurm_script
def test_multi_node_and_slurm_preflights_count_every_node(launcher: Launcher) -> None:
    multi_node = {**MULTI_NODE_ENV, "NNODES": "2:4", "NPROC_PER_NODE": "2"}
    assert launcher.run("train_multi_node.sh", **multi_node).returncode == 0
    assert launcher.run("train_slurm.sbatch", **{**SLURM_ENV, "NPROC_PER_NODE": "2"}).returncode == 0
    assert [call["PREFLIGHT_WORLD_SIZE"] for call in launcher.preflight_calls()] == ["8", "4"]


@pytest.mark.parametrize("env", [{"PREFLIGHT": "0"}, {"MODULE": f"{PACKAGE_NAME}.doctor"}], ids=["off", "doctor"])
def test_no_preflight_when_turned_off_or_for_another_module(launcher: Launcher, env: dict) -> None:
    assert launcher.run("train_single_node.sh", NPROC_PER_NODE="1", **env).returncode == 0
    assert launcher.preflight_calls() == []
    launcher.launch_call()  # torchrun still runs


@pytest.mark.parametrize("status, last_line", [
    ("2", "error: --learning_rate: a bad value"),  # a bad setting: the preflight's own line, alone
    ("1", f"error: the preflight check (python -m {PACKAGE_NAME}.preflight) failed with status 1: nothing was started"),
])
def test_a_failed_preflight_starts_nothing(launcher: Launcher, status: str, last_line: str) -> None:
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="1", FAKE_PREFLIGHT_STATUS=status)
    assert result.returncode == int(status)
    error_lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert [line.replace(launcher.env["PYTHON"], "python") for line in error_lines] == [last_line]
    preflights = launcher.preflight_calls()
    assert [call for call in launcher.calls() if call["argv"][:1] != ["-c"] and call not in preflights] == []


def test_src_is_first_on_pythonpath_so_a_checkout_runs_uninstalled(launcher: Launcher) -> None:
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="1", PYTHONPATH="/elsewhere")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT / "src"), "/elsewhere"]


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
        "-m",
        f"{PACKAGE_NAME}.torchrun",
        "--nnodes=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29123",
        f"--rdzv-id={PACKAGE_NAME}",
        *hosting,
        "--nproc-per-node=1",
        "--max-restarts=0",
        "-m",
        f"{PACKAGE_NAME}.train",
        config_file,
        "--seed",
        "7",
    ]
    assert call["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_multi_node_elastic_range_with_its_own_endpoint_id_and_address(launcher: Launcher) -> None:
    result = launcher.run(
        "train_multi_node.sh",
        NNODES="02:4",
        NPROC_PER_NODE="1",
        MAX_RESTARTS="3",
        RDZV_ENDPOINT="store-host:29400",
        RDZV_ID="job-7",
        LOCAL_ADDR="10.0.0.2",
    )
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["argv"][2:9] == [
        "--nnodes=2:4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=store-host:29400",
        "--rdzv-id=job-7",
        "--local-addr=10.0.0.2",
        "--nproc-per-node=1",
        "--max-restarts=3",
    ]


def test_multi_node_runs_static_rendezvous_on_master_addr(launcher: Launcher, config_file: str) -> None:
    result = launcher.run(
        "train_multi_node.sh", config_file, "--seed", "7", **MULTI_NODE_ENV, RDZV_BACKEND="static", MASTER_PORT="29123"
    )
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr
    assert launcher.launch_call()["argv"] == [
        "-m",
        f"{PACKAGE_NAME}.torchrun",
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


def test_static_rendezvous_with_restarts_warns_that_they_may_not_connect(launcher: Launcher) -> None:
    result = launcher.run("train_multi_node.sh", **MULTI_NODE_ENV, RDZV_BACKEND="static", MAX_RESTARTS="2")
    assert result.returncode == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert "pytorch/pytorch#135712" in warning and "RDZV_BACKEND=c10d" in warning
    assert "--max-restarts=2" in launcher.launch_call()["argv"]


@pytest.mark.parametrize("script", ["train_single_node.sh", "train_multi_node.sh", "train_slurm.sbatch"])
def test_module_runs_the_doctor_instead_of_train_with_the_same_arguments(
    launcher: Launcher, config_file: str, script: str
) -> None:
    if not (SCRIPTS / script).exists():
        pytest.skip(f"{script} was not generated")
    env = {"train_single_node.sh": {"NPROC_PER_NODE": "1"}, "train_multi_node.sh": MULTI_NODE_ENV}.get(
        script, SLURM_ENV
    )
    result = launcher.run(script, config_file, "--seed", "7", **env, MODULE=f"{PACKAGE_NAME}.doctor")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["argv"][-5:] == ["-m", f"{PACKAGE_NAME}.doctor", config_file, "--seed", "7"]


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
@pytest.mark.parametrize(
    ("job_cpus", "srun_cpus"),
    [
        ({"SLURM_CPUS_PER_GPU": "8"}, "--cpus-per-gpu=8"),  # what the #SBATCH lines ask for
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
    result = launcher.run(
        spool / "slurm_script",
        config_file,
        "--seed",
        "7",
        **SLURM_ENV,
        **job_cpus,
        SLURM_SUBMIT_DIR=str(REPO_ROOT),
        MASTER_PORT="29123",
    )
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["program"] == "srun"
    assert call["argv"] == [
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        srun_cpus,  # srun does not always pass the job's CPUs on to its task, which runs every rank
        str(launcher.bin / "python"),
        "-m",
        f"{PACKAGE_NAME}.torchrun",
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


@needs_slurm_script
def test_slurm_reads_a_long_host_list_written_in_pieces_and_picks_the_first_host(launcher: Launcher) -> None:
    # A real scontrol writes a long list in several writes. A reader that stops after the first line
    # (`| head -n 1`) closes the pipe; scontrol then dies of SIGPIPE and, under pipefail, so did the job
    # (status 141, no message).
    hosts, prefix = 5000, "gpu-node-rack-a-"
    assert sum(len(f"{prefix}{i}\n") for i in range(1, hosts + 1)) > 64 * 1024, "must not fit one pipe buffer"
    nodelist = f"{prefix}[1-{hosts}]"
    result = launcher.run(
        "train_slurm.sbatch",
        **{**SLURM_ENV, "SLURM_JOB_NODELIST": nodelist, "SLURM_NNODES": str(hosts)},
        MASTER_PORT="29123",
        FAKE_HOST_COUNT=str(hosts),
        FAKE_HOST_PREFIX=prefix,
        FAKE_SCONTROL_PAUSE="0.3",
    )
    assert result.returncode == 0, result.stderr
    scontrol_calls = [call["argv"] for call in launcher.calls() if call["program"] == "scontrol"]
    assert scontrol_calls == [["show", "hostnames", nodelist]]
    argv = launcher.launch_call()["argv"]
    assert f"--nnodes={hosts}" in argv
    assert f"--rdzv-endpoint={prefix}1:29123" in argv


@needs_slurm_script
@pytest.mark.parametrize(
    ("scontrol", "error_line"),
    [
        (
            {"FAKE_SCONTROL_STATUS": "3"},
            "error: 'scontrol show hostnames node[1-2]' failed with status 3: "
            "cannot find the job's first node to host the rendezvous",
        ),
        (
            {"FAKE_HOST_COUNT": "0"},
            "error: 'scontrol show hostnames node[1-2]' printed no host name: "
            "cannot find the job's first node to host the rendezvous",
        ),
    ],
    ids=["scontrol-fails", "scontrol-prints-nothing"],
)
def test_slurm_without_a_first_host_stops_with_an_error_line_naming_scontrol(
    launcher: Launcher, scontrol: dict, error_line: str
) -> None:
    result = launcher.run("train_slurm.sbatch", **SLURM_ENV, **scontrol)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == error_line
    assert [call["program"] for call in launcher.calls() if call["program"] == "srun"] == []


# The same ERR trap (scripts/_common.sh) serves every launch script: a probe sources it the same way.
UNEXPECTED_FAILURES = [
    pytest.param(
        "first_line() { yes | head -n 1; }\nfirst_line >/dev/null\n",
        141,
        "error: probe.sh: 'head -n 1' failed with status 141 (probe.sh line 4; pipeline statuses: 141 0)",
        id="reader-stops-early-in-a-function",
    ),
    pytest.param(
        "hosts=\"$(sh -c 'echo node1; exit 3')\"\n",
        3,
        "error: probe.sh: 'hosts=\"$(sh -c 'echo node1; exit 3')\"' failed with status 3 (probe.sh line 4)",
        id="command-substitution-named-once",
    ),
]


@pytest.mark.parametrize(("body", "status", "error_line"), UNEXPECTED_FAILURES)
def test_unexpected_failure_ends_with_one_error_line_naming_the_command(
    tmp_path: Path, body: str, status: int, error_line: str
) -> None:
    probe = tmp_path / "probe.sh"
    probe.write_text(f'set -euo pipefail\nsource "{SCRIPTS / "_common.sh"}"\n\n{body}echo "not reached"\n')
    result = subprocess.run(["bash", str(probe)], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == status
    assert result.stdout == ""
    assert result.stderr.splitlines() == [error_line]


LAUNCHES = [
    pytest.param("train_single_node.sh", {"NPROC_PER_NODE": "1"}, id="single-node"),
    pytest.param("train_multi_node.sh", MULTI_NODE_ENV, id="multi-node"),
    pytest.param("train_slurm.sbatch", SLURM_ENV, id="slurm", marks=needs_slurm_script),
]


@pytest.mark.parametrize(("script", "env"), LAUNCHES)
def test_torchrun_gets_a_fresh_rendezvous_store_per_restart_by_default(
    launcher: Launcher, script: str, env: dict
) -> None:
    # Restarted workers otherwise read the previous attempt's addresses (pytorch/pytorch#135712).
    result = launcher.run(script, **env)
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


@pytest.mark.parametrize(("script", "env"), LAUNCHES)
def test_rendezvous_store_sharing_chosen_by_the_user_is_kept(launcher: Launcher, script: str, env: dict) -> None:
    result = launcher.run(script, **env, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="0")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"


def sbatch_directives() -> list[str]:
    """The #SBATCH lines sbatch reads: those before the first command."""
    lines = []
    for line in SLURM_SCRIPT.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            lines.append(line)
    return lines


def default_nproc_per_node() -> str:
    result = subprocess.run(
        ["bash", "-c", 'source scripts/_common.sh && printf %s "$DEFAULT_NPROC_PER_NODE"'],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout


@needs_slurm_script
def test_sbatch_requests_one_gpu_per_rank_with_a_working_directive() -> None:
    # With nproc_per_node 'auto' the request used to be rendered commented out, and the job
    # stopped at its first use of a GPU.
    default = default_nproc_per_node()
    expected = "8" if default == "auto" else default
    gpu_requests = [line for line in sbatch_directives() if "gpus-per-node" in line or "gres" in line]
    assert gpu_requests == [f"#SBATCH --gpus-per-node={expected}"]
    assert [line for line in SLURM_SCRIPT.read_text().splitlines() if line.startswith("##SBATCH")] == []


@needs_slurm_script
def test_sbatch_asks_for_no_cpus_so_that_a_cpu_partition_takes_the_script() -> None:
    # An #SBATCH --cpus-per-gpu line cannot be undone from the command line, and a partition without GPUs
    # refuses it (tests/test_slurm.py submits the script to one). The CPUs are asked for on the command line.
    assert [line for line in sbatch_directives() if "cpus-per" in line] == []


def test_scripts_parse_in_bash() -> None:
    for script in sorted(SCRIPTS.iterdir()):
        result = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
        assert result.returncode == 0, f"{script.name}: {result.stderr}"


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_scripts_pass_shellcheck() -> None:
    scripts = [str(p.relative_to(REPO_ROOT)) for p in sorted(SCRIPTS.iterdir())]
    result = subprocess.run(["shellcheck", "-x", *scripts], cwd=REPO_ROOT, check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@needs_slurm_script
def test_sbatch_asks_for_sigterm_before_the_time_limit_and_may_be_requeued() -> None:
    lines = SLURM_SCRIPT.read_text().splitlines()
    assert "#SBATCH --requeue" in lines
    assert "#SBATCH --open-mode=append" in lines  # each attempt of a requeued job keeps the log of the ones before
    assert [line for line in lines if line.startswith("#SBATCH --signal=")] == ["#SBATCH --signal=B:TERM@120"]


@needs_slurm_script
def test_slurm_job_whose_training_fails_ends_with_an_error_line(launcher: Launcher) -> None:
    result = launcher.run(SLURM_SCRIPT, **SLURM_ENV, FAKE_SRUN_STATUS="3")
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line == "error: srun ended with status 3 (the training's own error is above)"
    assert "requeue" not in json.dumps(launcher.calls())
