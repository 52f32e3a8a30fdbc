"""The CI's scheduling (Makefile, `make test`'s second stage): the suite renders run one after the
other on one pytest-xdist worker, everything else on whichever worker is free. A real pytest run on 2
workers, with tests named as the suite renders are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import SUITE_RENDERS, TEMPLATE_DIR

CONFTEST = f"""
import importlib.util

spec = importlib.util.spec_from_file_location("template_conftest", {str(TEMPLATE_DIR / "tests" / "conftest.py")!r})
template_conftest = importlib.util.module_from_spec(spec)
spec.loader.exec_module(template_conftest)
pytest_xdist_make_scheduler = template_conftest.pytest_xdist_make_scheduler
"""

TESTS = f"""
import os, time
from pathlib import Path

import pytest

def record(name):
    time.sleep(0.5)  # long enough that both workers take work
    Path(os.environ["RAN_DIR"], name).write_text(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("combo", ["trainer", "native"])
def {SUITE_RENDERS}(combo):
    record(combo)

@pytest.mark.parametrize("number", range(6))
def test_another_render(number):
    record(str(number))
"""


def test_make_test_runs_the_suite_renders_on_one_worker_and_the_rest_on_both(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_stage.py").write_text(TESTS)
    ran = tmp_path / "ran"
    ran.mkdir()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                             "--dist", "loadgroup", "test_stage.py"], cwd=tmp_path, capture_output=True,
                            text=True, env={**os.environ, "RAN_DIR": str(ran)}, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    worker = {path.name: path.read_text() for path in ran.iterdir()}
    assert len(worker) == 8, result.stdout
    assert worker["trainer"] == worker["native"], worker
    assert set(worker.values()) == {"gw0", "gw1"}, worker  # the other tests went to both
