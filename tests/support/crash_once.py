"""Run <package>.train, but crash one worker once with SIGKILL: the failure torchrun's restarts must survive.

Run it in place of the train module, with tests/ on PYTHONPATH: `MODULE=crash_once scripts/train_single_node.sh ...`.
Set in the environment:

- CRASH_MARKER: a file path. The crash creates it first, so it happens once: restarted workers run
  plain train.
- CRASH_RANK: the rank that crashes.
- CRASH_AT: `after_checkpoint` kills at that rank's first optimizer step after a complete
  checkpoint appeared in CRASH_OUTPUT_DIR. (That step's gradient all-reduce waited for rank 0,
  so rank 0 had finished writing the checkpoint.) `mid_save` kills right after torch.save wrote
  into a tmp-checkpoint-N folder, while an earlier complete checkpoint exists. That is the
  native loop's atomic save, in the middle, with the weights written and the rename still to do.
- CRASH_OUTPUT_DIR: the run's --output_dir.

After the crash, the restarted CRASH_RANK writes what CRASH_OUTPUT_DIR held when it started (each
entry, and whether it is a complete checkpoint) to CRASH_MARKER.restart.json, before it trains.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

PACKAGE = next(path.parent.name for path in (Path(__file__).resolve().parents[1] / "src").glob("*/__init__.py"))
MARKER = Path(os.environ["CRASH_MARKER"])
OUTPUT_DIR = Path(os.environ["CRASH_OUTPUT_DIR"])
# The file each loop writes last into a checkpoint: the native loop's training state, the Trainer's state.
LAST_WRITTEN = ("training_state.pt", "trainer_state.json")


def complete_checkpoints() -> list[str]:
    if not OUTPUT_DIR.is_dir():
        return []
    return sorted(path.name for path in OUTPUT_DIR.glob("checkpoint-*")
                  if any((path / name).is_file() for name in LAST_WRITTEN))


def crash() -> None:
    """SIGKILL this process, the first time only."""
    try:
        MARKER.open("x").close()
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def crash_after_checkpoint(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    if complete_checkpoints():
        crash()


def crash_mid_save() -> None:
    save = torch.save

    def save_then_crash(obj, f, *args, **kwargs):
        save(obj, f, *args, **kwargs)
        if isinstance(f, (str, os.PathLike)) and Path(f).parent.name.startswith("tmp-") and complete_checkpoints():
            crash()

    torch.save = save_then_crash


def record_restart() -> None:
    """On the restarted attempt: what output_dir held before train looked at it."""
    listing = {path.name: path.name in complete_checkpoints() for path in sorted(OUTPUT_DIR.iterdir())}
    with Path(f"{MARKER}.restart.json").open("w") as out:
        json.dump(listing, out)


if __name__ == "__main__":
    if os.environ["RANK"] == os.environ["CRASH_RANK"]:
        if MARKER.exists():
            record_restart()
        elif os.environ["CRASH_AT"] == "after_checkpoint":
            register_optimizer_step_pre_hook(crash_after_checkpoint)
        elif os.environ["CRASH_AT"] == "mid_save":
            crash_mid_save()
        else:
            raise SystemExit(f"CRASH_AT={os.environ['CRASH_AT']!r}: expected after_checkpoint or mid_save")
    runpy.run_module(f"{PACKAGE}.train", run_name="__main__", alter_sys=True)
