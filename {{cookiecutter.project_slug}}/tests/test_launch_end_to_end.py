"""The launch scripts start real training: one node with two processes, and two local nodes meeting by
c10d rendezvous (the default) and by static rendezvous."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import EVAL_SIZE, REPO_ROOT, finish, free_port, read_metrics, run_env, smoke_flags, start

pytestmark = pytest.mark.slow  # real launches: `make test-all`

SCRIPTS = REPO_ROOT / "scripts"


def test_single_node_script_trains_with_two_processes(smoke_assets: Path, tmp_path: Path) -> None:
    flags = [*smoke_flags(smoke_assets, tmp_path)[:-2], "--num_train_epochs", "1", "--save_strategy", "no"]
    assert "--disable_tqdm" not in flags  # left to the default: output to a pipe, as to a log file
    result = finish(start([str(SCRIPTS / "train_single_node.sh"), *flags], run_env(NPROC_PER_NODE="2")))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "world size 2" in result.stdout
    # The preflight ran first, and said what it found.
    assert ("preflight: 256 train and 101 eval examples, single_label_classification, labels ['negative', "
            "'positive'], 2 process(es) on CPU, precision no: settings and data look right") in result.stdout
    assert read_metrics(tmp_path)["eval_num_examples"] == EVAL_SIZE
    # A log file holds whole lines: no progress-bar fragments, one JSON object per log step.
    assert "\r" not in result.stdout + result.stderr
    logged = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [entry["step"] for entry in logged if "loss" in entry] == [8]  # 1 epoch of 8 steps, logging_steps 8
    assert all(isinstance(entry["loss"], float) for entry in logged if "loss" in entry)


@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_multi_node_script_runs_as_two_local_nodes(smoke_assets: Path, tmp_path: Path, rendezvous: str) -> None:
    flags = [*smoke_flags(smoke_assets, tmp_path), "--num_train_epochs", "1", "--save_strategy", "no"]
    env = run_env(NNODES="2", NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                  RDZV_BACKEND=rendezvous)
    nodes = [start([str(SCRIPTS / "train_multi_node.sh"), *flags], {**env, "NODE_RANK": str(rank)}) for rank in (0, 1)]
    results = [finish(node) for node in nodes]
    assert [result.returncode for result in results] == [0, 0], "\n".join(
        result.stdout[-2000:] + result.stderr[-2000:] for result in results
    )
    # c10d numbers the nodes itself (by address and process id): rank 0, which logs, may be on either.
    assert "world size 2" in results[0].stdout + results[1].stdout
    assert read_metrics(tmp_path)["eval_num_examples"] == EVAL_SIZE
