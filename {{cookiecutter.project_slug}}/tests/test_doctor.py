"""The doctor's checks (the launch scripts' help naming it: test_scripts.py). The healthy run is two local
nodes through train_multi_node.sh (MODULE=<package>.doctor, c10d), the way a cluster user runs it. The
failures run in one process: an output_dir under a regular file (the tests run as root, so chmod would
not stop the writes), and a setting train refuses.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import PACKAGE, REPO_ROOT, finish, free_port, run_env, run_python, smoke_flags, start

pytestmark = pytest.mark.slow  # real launches: `make test-all`

DOCTOR = f"{PACKAGE}.doctor"
LINE = re.compile(r"^(PASS|WARN|FAIL|SKIP)  (.+?)(?: \(node (\d+), [^)]*\))?: (.*)$", re.MULTILINE)


def check_lines(output: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(check, node): (status, detail)} for every check line; node is '' on a line for all ranks."""
    lines = {(check, node): (status, detail) for status, check, node, detail in LINE.findall(output)}
    assert len(lines) == len(LINE.findall(output)), f"a check printed twice:\n{output}"
    return lines


def run_alone(args: list[str]) -> subprocess.CompletedProcess:
    return run_python(["-m", DOCTOR, *args], timeout=120)


@pytest.fixture(scope="module")
def two_nodes(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    output_dir = tmp_path_factory.mktemp("doctor_two_nodes")
    env = run_env(MODULE=DOCTOR, RDZV_BACKEND="c10d", NNODES="2", NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    script = str(REPO_ROOT / "scripts" / "train_multi_node.sh")
    nodes = [start([script, *smoke_flags(smoke_assets, output_dir)], {**env, "NODE_RANK": str(rank)})
             for rank in (0, 1)]
    try:
        results = [finish(node, timeout=180) for node in nodes]
    finally:  # a node that timed out fails the test; the other must not outlive it
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    output = "\n".join(result.stdout for result in results)
    return {"returncodes": [result.returncode for result in results], "output_dir": output_dir,
            "output": output, "lines": check_lines(output),
            "log": "\n".join(result.stdout + result.stderr for result in results)}


def test_healthy_two_node_run_prints_each_nodes_gpus_then_the_ranks_compared(two_nodes: dict) -> None:
    assert two_nodes["returncodes"] == [0, 0], two_nodes["log"][-4000:]
    statuses = {key: status for key, (status, _) in two_nodes["lines"].items()}
    # No GPU here: a warning on each node (training would run on the CPU), never a failure.
    assert statuses == {("GPUs", "0"): "WARN", ("GPUs", "1"): "WARN", ("backend", ""): "PASS",
                        ("same versions", ""): "PASS", ("output_dir", ""): "PASS"}, two_nodes["output"]
    assert two_nodes["output"].count("doctor: 0 failed, 2 warning(s): ready to train") == 1
    # output_dir is seen by all ranks and left clean.
    assert two_nodes["lines"]["output_dir", ""][1].endswith("all 2 ranks see each other's files in it")
    assert two_nodes["lines"]["same versions", ""][1].startswith("all 2 ranks run torch ")
    assert list(two_nodes["output_dir"].iterdir()) == [], "the doctor left its files behind"


def test_backend_reports_the_store_all_reduce_round_trip_and_bandwidth(two_nodes: dict) -> None:
    _, backend = two_nodes["lines"]["backend", ""]
    match = re.search(r"^gloo started in [\d.e-]+ s on 2 ranks, all connected to the store at \S+:\d+; "
                      r"all_reduce round trip ([\d.]+) ms \(4 bytes\), 16 MiB in ([\d.]+) ms: "
                      r"bus bandwidth ([\d.]+) GB/s$", backend)
    assert match, backend
    round_trip, large, bandwidth = map(float, match.groups())
    assert 0 < round_trip < large and bandwidth > 0


def test_an_unwritable_output_dir_fails_a_refused_setting_exits_2(smoke_assets: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where output_dir needs a folder\n")
    result = run_alone(smoke_flags(smoke_assets, blocker / "output"))
    assert result.returncode == 1, result.stdout + result.stderr
    lines = check_lines(result.stdout)
    assert lines["output_dir", ""][0] == "FAIL"
    assert lines["output_dir", ""][1].startswith(f"{blocker / 'output'} is not writable (rank 0 ")
    assert lines["ranks", ""][0] == "SKIP"  # one process: no group to start
    assert "doctor: 1 failed" in result.stdout
    # A setting train refuses is its error line and status 2.
    result = run_alone([*smoke_flags(smoke_assets, tmp_path), "--max_seq_length", "0"])
    assert result.returncode == 2
    assert result.stderr.startswith("error: --max_seq_length 0: must be >= 1"), result.stderr
    assert check_lines(result.stdout) == {}
