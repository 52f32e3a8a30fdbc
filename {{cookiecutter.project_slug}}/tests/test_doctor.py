"""The preflight doctor prints one line per check and exits 1 on a failure that would stop training.

The healthy run is two local nodes through train_multi_node.sh (MODULE=<package>.doctor, c10d), the
way a cluster user runs it. The failing ones: an output_dir under a regular file, on 2 processes
(torchrun --standalone; the tests run as root, so chmod would not stop the writes); a MASTER_ADDR
that does not resolve, and a MASTER_PORT already taken on the master, each in one process.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import PACKAGE, REPO_ROOT, finish, free_port, run_env, run_python, smoke_flags, start, torchrun

pytestmark = pytest.mark.slow  # real launches: `make test-all`

DOCTOR = f"{PACKAGE}.doctor"
LINE = re.compile(r"^(PASS|WARN|FAIL|SKIP)  (.+?)(?: \(node \d+, [^)]*\))?: (.*)$", re.MULTILINE)
# Checked once per node, then once for all ranks together (printed by rank 0).
NODE_CHECKS = ["config", "versions", "torchrun", "restarts", "GPUs", "precision", "master"]
ALL_RANKS_CHECKS = ["backend", "same versions", "threads", "master port", "output_dir"]


def check_lines(output: str) -> list[tuple[str, str, str]]:
    """(status, check, detail) for every check line, node suffixes dropped."""
    return LINE.findall(output)


def statuses(output: str) -> dict[str, str]:
    """The status of each check (a check printed by several nodes must agree)."""
    found: dict[str, set[str]] = {}
    for status, check, _ in check_lines(output):
        found.setdefault(check, set()).add(status)
    return {check: "/".join(sorted(values)) for check, values in found.items()}


def detail(output: str, check: str) -> str:
    (line,) = [detail for _, name, detail in check_lines(output) if name == check]
    return line


def run_alone(args: list[str], **env: str) -> subprocess.CompletedProcess:
    """The doctor in one plain process, as on a node before its job starts."""
    return run_python(["-m", DOCTOR, *args], timeout=120, env=run_env(**env))


@pytest.fixture(scope="module")
def two_nodes(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    output_dir = tmp_path_factory.mktemp("doctor_two_nodes")
    env = run_env(MODULE=DOCTOR, RDZV_BACKEND="c10d", NNODES="2", NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    script = str(REPO_ROOT / "scripts" / "train_multi_node.sh")
    flags = smoke_flags(smoke_assets, output_dir)
    nodes = [start([script, *flags], {**env, "NODE_RANK": str(rank)}) for rank in (0, 1)]
    try:
        results = [finish(node, timeout=180) for node in nodes]
    finally:  # a node that timed out fails the test; the other must not outlive it
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    return {"returncodes": [result.returncode for result in results], "output_dir": output_dir,
            "output": "\n".join(result.stdout for result in results),
            "log": "\n".join(result.stdout + result.stderr for result in results)}


@pytest.fixture(scope="module")
def unwritable(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    blocker = tmp_path_factory.mktemp("doctor_unwritable") / "a-file"
    blocker.write_text("a file where output_dir needs a folder\n")
    output_dir = blocker / "output"
    result = torchrun(["-m", DOCTOR, *smoke_flags(smoke_assets, output_dir)], check=False, timeout=180)
    return {"returncode": result.returncode, "output": result.stdout, "log": result.stdout + result.stderr,
            "output_dir": output_dir}


def test_healthy_two_node_run_passes_and_exits_zero(two_nodes: dict) -> None:
    assert two_nodes["returncodes"] == [0, 0], two_nodes["log"][-4000:]
    found = statuses(two_nodes["output"])
    assert sorted(found) == sorted(NODE_CHECKS + ALL_RANKS_CHECKS), two_nodes["output"]
    # No GPU here: that alone is a warning (training would run on the CPU), never a failure.
    assert {check: status for check, status in found.items() if status != "PASS"} == {"GPUs": "WARN"}
    assert two_nodes["output"].count("doctor: 0 failed") == 1


def test_each_node_reports_its_own_checks_once_and_rank_0_the_shared_ones(two_nodes: dict) -> None:
    counts = {}
    for _, check, _ in check_lines(two_nodes["output"]):
        counts[check] = counts.get(check, 0) + 1
    assert counts == {check: 2 for check in NODE_CHECKS} | {check: 1 for check in ALL_RANKS_CHECKS}
    assert "(node 0, " in two_nodes["output"] and "(node 1, " in two_nodes["output"]


def test_backend_reports_all_reduce_round_trip_and_bandwidth(two_nodes: dict) -> None:
    backend = detail(two_nodes["output"], "backend")
    match = re.search(r"^gloo started in [\d.e-]+ s on 2 ranks; all_reduce round trip ([\d.]+) ms \(4 bytes\), "
                      r"16 MiB in ([\d.]+) ms: bus bandwidth ([\d.]+) GB/s$", backend)
    assert match, backend
    round_trip, large, bandwidth = map(float, match.groups())
    assert 0 < round_trip < large and bandwidth > 0


def test_output_dir_is_seen_by_all_ranks_and_left_clean(two_nodes: dict) -> None:
    assert "all 2 ranks see each other's files" in detail(two_nodes["output"], "output_dir")
    assert list(two_nodes["output_dir"].iterdir()) == [], "the doctor left its token files behind"


def test_master_port_is_reached_by_every_rank(two_nodes: dict) -> None:
    assert "accepts connections from all 2 ranks" in detail(two_nodes["output"], "master port")


def test_threads_are_counted_over_both_nodes_sharing_this_host(two_nodes: dict) -> None:
    threads = detail(two_nodes["output"], "threads")
    assert re.search(r"OMP_NUM_THREADS=1; host \S+ \(2 nodes\): 2 threads on \d+ CPUs", threads), threads


def test_unwritable_output_dir_fails_and_names_it(unwritable: dict) -> None:
    assert unwritable["returncode"] != 0, unwritable["log"][-3000:]
    found = statuses(unwritable["output"])
    assert found["output_dir"] == "FAIL"
    assert f"{unwritable['output_dir']} is not writable" in detail(unwritable["output"], "output_dir")
    assert found["backend"] == "PASS", "a failed check must not stop the others"
    assert "doctor: 1 failed" in unwritable["output"]


def test_unresolvable_master_fails(tmp_path: Path) -> None:
    result = run_alone(["--output_dir", str(tmp_path)], MASTER_ADDR="no-such-host.invalid", MASTER_PORT="29500")
    assert result.returncode == 1, result.stdout + result.stderr
    assert statuses(result.stdout)["master"] == "FAIL"
    assert "MASTER_ADDR 'no-such-host.invalid' does not resolve" in detail(result.stdout, "master")
    assert statuses(result.stdout)["output_dir"] == "PASS"
    assert statuses(result.stdout)["backend"] == "SKIP"  # one process: no group to start


def test_master_port_in_use_on_the_master_fails(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_alone(["--output_dir", str(tmp_path)], MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert result.returncode == 1, result.stdout + result.stderr
    assert statuses(result.stdout)["master"] == "FAIL"
    assert f"MASTER_PORT {port} is in use" in detail(result.stdout, "master")
