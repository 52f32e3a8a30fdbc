"""Finding the checkpoint to resume from, and every rank agreeing on it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch.distributed as dist

from .config import ConfigError, batch_split, check_same_batch_plan, read_batch_plan
from .distributed import is_distributed

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
# What to do with a checkpoint whose place in the epoch means nothing under this run's batch plan.
OTHER_PLAN_ADVICE = ("To continue it, run again with its settings; to train with these, use a new "
                     "--output_dir (without --resume_from_checkpoint).")
logger = logging.getLogger(__name__)


def complete_checkpoints(output_dir: str | Path, last_file: str) -> list[Path]:
    """The checkpoint-N folders of output_dir that hold last_file, oldest first: last_file is what the loop
    writes last into a checkpoint, so a save cut short never counts."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in folder.iterdir()
             if (match := CHECKPOINT_NAME.match(path.name)) and (path / last_file).is_file()]
    return [path for _, path in sorted(found)]


def checkpoint_problem(path: Path, last_file: str) -> str | None:
    if not path.exists():
        return "does not exist"
    if not (path / last_file).is_file():
        return (f"holds no {last_file}: pass a checkpoint-N folder written by this loop, or leave the flag out "
                "to resume from the newest one in --output_dir")
    return None


def agree_on_resume_checkpoint(explicit: str | None, output_dir: str, last_file: str) -> Path | None:
    """--resume_from_checkpoint if given, else the newest complete checkpoint in output_dir, else None.

    Rank 0 decides and every rank takes its answer: ranks that resumed from different steps would
    wait on each other forever. Then every rank checks that it can read that checkpoint, and all fail
    together: a rank failing alone would leave the others waiting until --ddp_timeout.
    """
    found = [Path(explicit)] if explicit is not None else complete_checkpoints(output_dir, last_file)
    chosen = found[-1:] or [None]
    if is_distributed():
        dist.broadcast_object_list(chosen, src=0)
    checkpoint = chosen[0]
    problem = None if checkpoint is None else checkpoint_problem(checkpoint, last_file)
    problems = [problem]
    if is_distributed():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    if problems[0] is not None:
        flag = "--resume_from_checkpoint" if explicit is not None else "checkpoint"
        raise ConfigError(f"{flag} {str(checkpoint)!r} {problems[0]}")
    failed = [str(rank) for rank, theirs in enumerate(problems) if theirs is not None]
    if failed:
        raise ConfigError(
            f"checkpoint {str(checkpoint)!r} is on rank 0 but rank(s) {', '.join(failed)} cannot read it "
            f"({problems[int(failed[0])]}): with several nodes, --output_dir must be on a filesystem every node shares"
        )
    return checkpoint


def accumulation_to_resume(checkpoint: Path | None, per_device_batch_size: int, accumulation_steps: int,
                           world_size: int) -> int:
    """Gradient accumulation that keeps the global batch of `checkpoint` (None: a new run) on world_size
    processes. A job stopped on 8 GPUs often comes back on 4: accumulating twice as many micro-batches
    keeps every optimizer step the same."""
    saved = read_batch_plan(checkpoint)
    if saved is None:
        return accumulation_steps
    global_batch, processes = saved["global_batch_size"], saved["world_size"]
    if processes != world_size:
        if global_batch % (per_device_batch_size * world_size):
            raise ConfigError(
                f"the checkpoint's global batch of {global_batch} ({processes} processes x "
                f"{saved['per_device_train_batch_size']} x {saved['gradient_accumulation_steps']} "
                f"accumulation steps) cannot be made from --per_device_train_batch_size "
                f"{per_device_batch_size} on {world_size} processes; pick a batch size that, times "
                f"{world_size}, divides {global_batch}")
        accumulation_steps = global_batch // (per_device_batch_size * world_size)
        logger.info("resuming a run of %d processes on %d: %d accumulation steps keep its global batch of %d",
                    processes, world_size, accumulation_steps, global_batch)
    current = batch_split(world_size, per_device_batch_size, accumulation_steps)
    check_same_batch_plan(checkpoint, saved, current, same=("global_batch_size",), advice=OTHER_PLAN_ADVICE)
    return accumulation_steps
