"""bench/gpu_check.sh --cpu end to end: the GPU check's logic (renders, throughput eager and compiled, the
compute limit, the profiled steps, half-precision checkpoints, 2 processes) at tiny sizes on the CPU, as CI
can run it.

What the CPU cannot show: the GPU's busy time, kernel launches and CUDA synchronisations (None here), and
any figure worth reading; a GPU run of the same script gives those.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.rendered_suite
def test_gpu_check_runs_end_to_end_on_the_cpu_with_its_profile_and_compute_limit(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_BUDGET_SECONDS="1800", OMP_NUM_THREADS="1")
    result = subprocess.run(["bash", str(BENCH / "gpu_check.sh"), "--cpu", "--workdir", str(tmp_path / "work"),
                             "--json", str(tmp_path / "check.json")],
                            env=env, capture_output=True, text=True, timeout=1900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    check = json.loads((tmp_path / "check.json").read_text())
    assert [profile["loop"] for profile in check["profile"]] == ["native", "trainer"]
    for profile in check["profile"]:
        assert profile["steps"] == 10 and profile["wall_ms"] > 0 and profile["cpu_ms"] > 0, profile
        assert profile["gpu_busy_ms"] is None and profile["kernel_launches"] is None, profile  # no GPU
        assert profile["reads_back"] >= 0, profile
    compiled = [run for run in check["throughput"] if run["loop"].endswith("--torch_compile")]
    assert [run["loop"] for run in compiled] == ["native --torch_compile", "trainer --torch_compile"], check
    assert all(run["compiled_graphs"] >= 1 and run["samples_per_s"] > 0 for run in compiled), compiled
    limit = check["compute_limit"]
    assert limit["timed_steps"] > 0 and limit["samples_per_s"] > 0, limit
    assert "| compute limit (bare eager loop) |" in result.stdout
    assert "Where a step's time goes" in result.stdout
    rows = [row for row in result.stdout.splitlines() if row.startswith(("| native | ", "| trainer | "))]
    assert len(rows) >= 4, result.stdout  # each loop's throughput and profile rows, at least
    # The --fsdp run through a checkpoint and a resume (native only: the Trainer refuses --fsdp on CPU).
    assert [run["loop"] for run in check["several_processes"]] == ["native", "trainer", "native --fsdp"], check
    sharded = check["several_processes"][-1]
    assert sharded["passed"] and "resumed from checkpoint-10 to step 20" in sharded["detail"], sharded
    assert sharded["resume_weight_difference"] == 0.0, sharded  # on the CPU the resume is exact
