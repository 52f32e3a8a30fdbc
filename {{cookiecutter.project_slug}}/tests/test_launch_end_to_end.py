"""The launch scripts start real training: one node with two processes, and two local nodes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from conftest import EVAL_SIZE, REPO_ROOT, finish, run_env, smoke_flags, start

SCRIPTS = REPO_ROOT / "scripts"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_metrics(output_dir: Path) -> dict:
    return json.loads((output_dir / "metrics.json").read_text())


def test_single_node_script_trains_with_two_processes(smoke_assets: Path, tmp_path: Path) -> None:
    flags = [*smoke_flags(smoke_assets, tmp_path), "--num_train_epochs", "1", "--save_strategy", "no"]
    result = finish(start([str(SCRIPTS / "train_single_node.sh"), *flags], run_env(NPROC_PER_NODE="2")))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout
    assert read_metrics(tmp_path)["eval_num_examples"] == EVAL_SIZE


def test_multi_node_script_runs_as_two_local_nodes(smoke_assets: Path, tmp_path: Path) -> None:
    flags = [*smoke_flags(smoke_assets, tmp_path), "--num_train_epochs", "1", "--save_strategy", "no"]
    env = run_env(NNODES="2", NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    nodes = [start([str(SCRIPTS / "train_multi_node.sh"), *flags], {**env, "NODE_RANK": str(rank)}) for rank in (0, 1)]
    results = [finish(node) for node in nodes]
    assert [result.returncode for result in results] == [0, 0], "\n".join(
        result.stdout[-2000:] + result.stderr[-2000:] for result in results
    )
    assert "world size 2" in results[0].stdout
    assert read_metrics(tmp_path)["eval_num_examples"] == EVAL_SIZE
