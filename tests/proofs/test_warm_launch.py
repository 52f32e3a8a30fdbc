"""The warm launches of the tests (tests/conftest.py's run_python and torchrun) run as a new command would:
the environment they are given and no other, the repo as working directory, output of their own, the
exit status the program gave, the program as __main__, and no process left behind."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import psutil
from conftest import REPO_ROOT, run_env
from warm_launch import run_python, torchrun

SCRIPT = textwrap.dedent(
    """
    import json, logging, os, signal, sys

    import torch

    logging.getLogger("probe").warning("a warning")  # no handler set up: Python's last resort, on stderr
    print(json.dumps({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(), "marker": os.environ.get("MARKER"),
                      "inherited": os.environ.get("ONLY_IN_THE_TEST_PROCESS"), "threads": torch.get_num_threads(),
                      "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}))
    sys.exit(int(sys.argv[1]))
    """
)


def test_run_python_runs_a_script_as_a_new_command_would(tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "probe.py"
    script.write_text(SCRIPT)
    env = run_env(MARKER="given", OMP_NUM_THREADS="2")
    monkeypatch.setenv("ONLY_IN_THE_TEST_PROCESS", "1")  # in this process only, after the command's env was made
    result = run_python([str(script), "3"], env=env)
    assert result.returncode == 3
    seen = json.loads(result.stdout)
    assert seen == {"name": "__main__", "argv": [str(script), "3"], "cwd": str(REPO_ROOT), "marker": "given",
                    "inherited": None, "threads": 2, "sigterm_default": True}
    assert result.stderr.strip() == "a warning"


def test_run_python_reports_an_uncaught_exception_with_status_1_and_its_traceback(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("raise RuntimeError('broken')\n")
    result = run_python([str(script)])
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert result.stderr.strip().splitlines()[-1] == "RuntimeError: broken"


def test_torchrun_starts_two_ranks_that_meet_and_leave_no_process(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(
        """
        import os, sys
        from pathlib import Path

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        total = torch.tensor([dist.get_rank() + 1])
        dist.all_reduce(total)
        Path(sys.argv[1], f"rank{dist.get_rank()}").write_text(f"{dist.get_world_size()} {int(total)} {os.getpid()}")
        dist.destroy_process_group()
        """
    ))
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    torchrun([str(script), str(tmp_path)])
    records = [(tmp_path / f"rank{rank}").read_text().split() for rank in (0, 1)]
    assert [(world, total) for world, total, _ in records] == [("2", "3"), ("2", "3")]
    assert os.getpid() not in {int(pid) for _, _, pid in records}, "a rank ran in the test process"
    assert {child.pid for child in psutil.Process().children(recursive=True)} <= before
