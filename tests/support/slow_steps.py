"""Run <package>.train with a pause after every optimizer step: a run that lasts long on few steps.

Run it in place of the train module, with tests/ on PYTHONPATH: `MODULE=slow_steps sbatch
scripts/train_slurm.sbatch ...`, STEP_PAUSE seconds after each step (and START_PAUSE seconds before the
run). A real SLURM time limit signals up to 30 s after it is due (tests/test_slurm.py), so the job it
stops must still be training then: the pauses make it last without training more, and leave the CPU to
the tests that run at the same time. They change nothing the run computes.
"""

from __future__ import annotations

import os
import runpy
import time
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_post_hook

PACKAGE = next(path.parent.name for path in (Path(__file__).resolve().parents[1] / "src").glob("*/__init__.py"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0"))
# START_PAUSE: seconds each process waits, before the run, after printing that it does: a window in which
# a stop finds workers that have started but not yet set their SIGTERM handler.
START_PAUSE = float(os.environ.get("START_PAUSE", "0"))

if __name__ == "__main__":
    if START_PAUSE:
        print(f"slow_steps: waiting {START_PAUSE:g} s before the run", flush=True)
        time.sleep(START_PAUSE)
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: time.sleep(PAUSE))
    runpy.run_module(f"{PACKAGE}.train", run_name="__main__", alter_sys=True)
