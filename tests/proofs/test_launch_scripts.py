"""The launch scripts' every rule, beyond the checks a render keeps in its own tests/test_scripts.py.

Copied into a render's tests/ beside that file, whose recorder (Launcher: PYTHON, srun and scontrol
write down how they were called) these tests use. No test here starts torchrun, SLURM or a GPU: each
reads the exact command a script would have run, or proves that nothing was run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PACKAGE, REPO_ROOT
from test_scripts import (
    MULTI_NODE_ENV,
    SCRIPTS,
    SLURM_ENV,
    SLURM_SCRIPT,
    Launcher,
    assert_stopped_before_torchrun,
    needs_slurm_script,
)

CPU_COUNT = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.fixture
def launcher(tmp_path: Path) -> Launcher:
    return Launcher(tmp_path)


@pytest.fixture
def config_file(tmp_path: Path) -> str:
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1.0e-5\n")
    return str(path)


# Beyond the settings every script reads (tests/test_scripts.py checks those).
HELP_WORDS = {
    "train_multi_node.sh": ["NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS=1"]
    + ["RDZV_BACKEND", "c10d", "static", "RDZV_ENDPOINT", "RDZV_ID", "MIN:MAX", "LOCAL_ADDR", "pytorch/pytorch#135712"]
    + ["--ddp_timeout", "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME"],
    "train_slurm.sbatch": ["MASTER_PORT", "sbatch"],
}
# torchrun already sets it, and 3 (not 1) is the default: advice to set it to 1 does nothing.
USELESS_HELP_WORDS = ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]


@pytest.mark.parametrize("flag", ["-h", "--help"])
@pytest.mark.parametrize("script", ["train_single_node.sh", "train_multi_node.sh", "train_slurm.sbatch"])
def test_help_lists_each_scripts_own_environment_and_no_useless_advice(
    launcher: Launcher, script: str, flag: str
) -> None:
    if not (SCRIPTS / script).exists():
        pytest.skip(f"{script} was not generated")
    result = launcher.run(script, flag)
    assert result.returncode == 0, result.stderr
    for word in HELP_WORDS.get(script, []):
        assert word in result.stdout, f"{word} missing from {script} {flag}"
    for word in USELESS_HELP_WORDS:
        assert word not in result.stdout, f"{script} {flag} still advises {word}"
    assert launcher.calls() == []


# (script, environment, arguments, text the one-line error must hold), beyond tests/test_scripts.py's.
BAD_SETTINGS = [
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
        "train_single_node.sh", {"NPROC_PER_NODE": "1", "PYTHON": "/no/such/python"}, [], "PYTHON", id="python-missing"
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
    assert_stopped_before_torchrun(launcher, launcher.run(script, *args, **env), named)


def test_the_launcher_checks_the_settings_for_the_whole_world_size_first(launcher: Launcher, config_file: str) -> None:
    result = launcher.run("train_single_node.sh", config_file, "--seed", "3", NPROC_PER_NODE="3")
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["argv"][:2] == ["-m", f"{PACKAGE}.torchrun"]
    assert call["argv"][-3:] == [config_file, "--seed", "3"]
    assert call["PREFLIGHT_WORLD_SIZE"] == "3"  # torchrun.py runs the preflight for 3 processes


@needs_slurm_script
def test_multi_node_and_slurm_preflights_count_every_node(launcher: Launcher) -> None:
    multi_node = {**MULTI_NODE_ENV, "NNODES": "2:4", "NPROC_PER_NODE": "2"}
    assert launcher.run("train_multi_node.sh", **multi_node).returncode == 0
    assert launcher.run("train_slurm.sbatch", **{**SLURM_ENV, "NPROC_PER_NODE": "2"}).returncode == 0
    launches = [call for call in launcher.calls() if call["program"] in ("python", "srun") and "-c" not in call["argv"]]
    assert [call["PREFLIGHT_WORLD_SIZE"] for call in launches] == ["8", "4"]


@needs_slurm_script
def test_slurm_asks_for_the_nodes_this_attempt_holds_not_the_tasks_of_the_submission(launcher: Launcher) -> None:
    # A requeued job cut from 2 nodes to 1 while it waited: SLURM_NNODES is the new allocation's, SLURM_NTASKS
    # the submission's (as SLURM 22.05 sets them; tests/test_slurm.py runs it on a real cluster).
    shrunk = {**SLURM_ENV, "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_NTASKS": "2",
              "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_CPUS_PER_NODE": "2", "FAKE_HOST_COUNT": "1"}
    result = launcher.run("train_slurm.sbatch", **shrunk)
    assert result.returncode == 0, result.stderr
    call = launcher.launch_call()
    assert call["argv"][:5] == ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                                "--cpus-per-task=2"]
    assert "--nnodes=1" in call["argv"]
    assert call["PREFLIGHT_WORLD_SIZE"] == "1"


@pytest.mark.parametrize("env", [{"PREFLIGHT": "0"}, {"MODULE": f"{PACKAGE}.doctor"}], ids=["off", "doctor"])
def test_no_preflight_when_turned_off_or_for_another_module(launcher: Launcher, env: dict) -> None:
    assert launcher.run("train_single_node.sh", NPROC_PER_NODE="1", **env).returncode == 0
    assert launcher.launch_call()["PREFLIGHT_WORLD_SIZE"] is None  # torchrun still runs, unchecked


def test_src_is_first_on_pythonpath_so_a_checkout_runs_uninstalled(launcher: Launcher) -> None:
    result = launcher.run("train_single_node.sh", NPROC_PER_NODE="1", PYTHONPATH="/elsewhere")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT / "src"), "/elsewhere"]


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
        f"{PACKAGE}.torchrun",
        "--nnodes=2",
        "--node-rank=1",
        "--master-addr=10.0.0.1",
        "--master-port=29123",
        "--nproc-per-node=1",
        "--max-restarts=0",
        "-m",
        f"{PACKAGE}.train",
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
    result = launcher.run(script, config_file, "--seed", "7", **env, MODULE=f"{PACKAGE}.doctor")
    assert result.returncode == 0, result.stderr
    assert launcher.launch_call()["argv"][-5:] == ["-m", f"{PACKAGE}.doctor", config_file, "--seed", "7"]


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


@needs_slurm_script
def test_slurm_job_whose_training_fails_ends_with_an_error_line(launcher: Launcher) -> None:
    result = launcher.run(SLURM_SCRIPT, **SLURM_ENV, FAKE_SRUN_STATUS="3")
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line == "error: srun ended with status 3 (the training's own error is above)"
    assert "requeue" not in json.dumps(launcher.calls())


@needs_slurm_script
def test_slurm_takes_sruns_own_status_when_srun_ends_while_the_sigterm_trap_runs(launcher: Launcher) -> None:
    # The trap asks scontrol for the job's state (2 s here) and srun ends with status 1 meanwhile. The wait the
    # trap cut short returns 143, which would pass for "saved" and requeue a job whose training did not save.
    started = launcher.bin.parent / "srun-started"
    stubs = {"srun": f"touch {started}; sleep 1; exit 1",
             "scontrol": 'case "$2" in hostnames) echo node1; echo node2 ;; job) sleep 2; '
                         'echo "JobId=4242 JobState=RUNNING Restarts=0" ;; *) echo "scontrol $*" >&2 ;; esac',
             "scancel": "exit 0"}
    for name, body in stubs.items():
        (launcher.bin / name).write_text(f"#!/bin/sh\n{body}\n")
        (launcher.bin / name).chmod(0o755)
    script = subprocess.Popen(["bash", str(SLURM_SCRIPT)], cwd=REPO_ROOT, env={**launcher.env, **SLURM_ENV},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the script waits for srun by now
    script.send_signal(signal.SIGTERM)
    _, stderr = script.communicate(timeout=60)
    assert "asking the training to save" in stderr, stderr  # the trap ran while srun did
    assert stderr.strip().splitlines()[-1].startswith(
        "error: the training did not save at the stop: srun ended with status 1"), stderr
    assert "scontrol requeue" not in stderr


@needs_slurm_script
def test_slurm_job_whose_launcher_refused_a_bad_setting_ends_with_status_2_and_adds_no_error_line(
        launcher: Launcher) -> None:
    result = launcher.run(SLURM_SCRIPT, **SLURM_ENV, FAKE_SRUN_STATUS="2")  # the launchers' status for it
    assert result.returncode == 2
    assert "error:" not in result.stderr, result.stderr  # the launchers' own lines are the only ones


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


@pytest.mark.parametrize("script", ["train_single_node.sh", "train_multi_node.sh", "train_slurm.sbatch"])
def test_help_piped_into_a_reader_that_stops_early_ends_without_an_error(script: str) -> None:
    # The help is one write, after which `head` may go: no SIGPIPE to a second writer, no error line.
    if not (SCRIPTS / script).exists():
        pytest.skip(f"{script} was not generated")
    result = subprocess.run(["bash", "-c", f'bash "{SCRIPTS / script}" --help | head -n 1; exit "${{PIPESTATUS[0]}}"'],
                            check=False, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("Usage:")


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


@needs_slurm_script
def test_sbatch_asks_for_sigterm_before_the_time_limit_and_may_be_requeued() -> None:
    lines = SLURM_SCRIPT.read_text().splitlines()
    assert "#SBATCH --requeue" in lines
    assert "#SBATCH --open-mode=append" in lines  # each attempt of a requeued job keeps the log of the ones before
    assert [line for line in lines if line.startswith("#SBATCH --signal=")] == ["#SBATCH --signal=B:TERM@120"]
