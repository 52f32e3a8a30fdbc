"""Run a project's train module with a fault injected into one rank: the failures a launch must survive.

Run it in place of the train module, with this folder on PYTHONPATH: `MODULE=fault_inject
scripts/train_single_node.sh ...`. It faults rank FAULT_RANK once, at its first optimizer step after a
complete checkpoint appeared in FAULT_OUTPUT_DIR (that step's gradient all-reduce waited for rank 0, so
rank 0 had finished writing it). Set in the environment:

- FAULT_TRAIN_MODULE: the module it runs, e.g. text_classifier.train.
- FAULT: unset, nothing is injected (a node of the run that stays well); `kill` SIGKILLs the rank;
  `raise` raises an exception in the step; `hold` stops the rank there until the file
  FAULT_MARKER.release exists or the rank gets SIGTERM (the test then kills, signals or joins the run
  from outside).
- FAULT_RANK, FAULT_OUTPUT_DIR: which rank (unset: each rank this launch starts), and the run's --output_dir.
- FAULT_MARKER: a file path. The fault creates it first, with the time, the pid and the step, so it
  happens once: restarted workers run plain training.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import time
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_pre_hook

FAULT = os.environ.get("FAULT")
MARKER = Path(os.environ.get("FAULT_MARKER", "fault.json"))
OUTPUT_DIR = Path(os.environ.get("FAULT_OUTPUT_DIR", "."))
# The file each loop writes last into a checkpoint: the native loop's training state, the Trainer's state.
LAST_WRITTEN = ("training_state.pt", "trainer_state.json")
HOLD_SECONDS = 300  # a held rank goes on by itself after this, so that a broken test cannot leave it behind


class InjectedFault(RuntimeError):
    pass


def has_complete_checkpoint() -> bool:
    return any((path / name).is_file() for path in OUTPUT_DIR.glob("checkpoint-*") for name in LAST_WRITTEN)


def claim_fault(steps: int) -> bool:
    """Create the marker, once over all attempts: True for the attempt that faults."""
    try:
        with MARKER.open("x") as out:
            json.dump({"time": time.time(), "pid": os.getpid(), "step": steps, "fault": FAULT}, out)
    except FileExistsError:
        return False
    return True


def fault_after_checkpoint(optimizer, args, kwargs) -> None:
    if not has_complete_checkpoint() or not claim_fault(optimizer_steps(optimizer)):
        return
    if FAULT == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif FAULT == "raise":
        raise InjectedFault(f"fault injected into rank {os.environ['RANK']}")
    elif FAULT == "hold":
        release, deadline = Path(f"{MARKER}.release"), time.monotonic() + HOLD_SECONDS
        terminated, handler = [], signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame) -> None:  # the loop's own handler still runs: it saves the step
            terminated.append(signum)
            if callable(handler):
                handler(signum, frame)
            else:  # SIG_DFL or SIG_IGN: as without this handler
                signal.signal(signum, handler)
                os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        while not (release.exists() or terminated) and time.monotonic() < deadline:
            time.sleep(0.05)
        signal.signal(signal.SIGTERM, handler)


def optimizer_steps(optimizer) -> int:
    states = [state.get("step") for state in optimizer.state.values()]
    return int(max((float(step) for step in states if step is not None), default=0))


if __name__ == "__main__":
    if FAULT not in (None, "kill", "raise", "hold"):
        raise SystemExit(f"FAULT={FAULT!r}: expected kill, raise or hold")
    if FAULT is not None and os.environ.get("FAULT_RANK", os.environ["RANK"]) == os.environ["RANK"]:
        register_optimizer_step_pre_hook(fault_after_checkpoint)
    runpy.run_module(os.environ["FAULT_TRAIN_MODULE"], run_name="__main__", alter_sys=True)
