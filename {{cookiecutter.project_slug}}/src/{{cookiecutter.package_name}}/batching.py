"""Which examples each rank trains on, step by step: the samplers, the loaders and the batch plan.

Every rank draws the same order (shuffled with seed + epoch, unless sequential) and takes its share. As in
DistributedSampler, an order the ranks cannot split evenly is padded with its first examples (trained twice
that epoch), or cut with --dataloader_drop_last, as is each rank's last short batch.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from .config import batch_split, check_batch_fits
from .data import length_grouped_steps
from .resume import accumulation_to_resume
from .stopping import keep_through_sigterm
from .training_args import TrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class DistributedLengthGroupedSampler(Sampler[int]):
    """This rank's share of each epoch, in batches of examples of similar length, for less padding.

    Each epoch: shuffle, then cut into optimizer steps of similar length (data.length_grouped_steps) of
    batch_size x num_replicas x accumulation_steps examples, each sorted longest first; rank r takes
    slice r of each batch_size x num_replicas of them. The ranks then run batches of about the same
    length at the same step, so none waits long for the others at the all-reduce.
    """

    lengths: Sequence[int]
    batch_size: int
    num_replicas: int = 1
    rank: int = 0
    seed: int = 0
    drop_last: bool = False
    accumulation_steps: int = 1
    epoch: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank {self.rank} is outside [0, {self.num_replicas})")
        self.lengths = list(self.lengths)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        count = len(self.lengths)
        return count // self.num_replicas if self.drop_last else math.ceil(count / self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        global_batch = self.batch_size * self.num_replicas  # one micro-step of all ranks
        steps = length_grouped_steps(order, self.lengths, global_batch * self.accumulation_steps, generator)
        # Padded with the order's first examples to len(self) per rank, or cut (drop_last), at the end only:
        # every full step holds the same examples on any number of ranks.
        grouped = itertools.chain(itertools.chain.from_iterable(steps), itertools.cycle(order))
        grouped = list(itertools.islice(grouped, len(self) * self.num_replicas))
        for start in range(0, len(grouped), global_batch):
            batch = grouped[start : start + global_batch]
            share = len(batch) // self.num_replicas
            yield from batch[self.rank * share : (self.rank + 1) * share]


class ResumableSampler(Sampler[int]):
    """A distributed sampler whose epoch can start part-way, after the examples already trained on."""

    def __init__(self, sampler: DistributedSampler | DistributedLengthGroupedSampler) -> None:
        self.sampler = sampler
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.sampler.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self) -> int:
        return len(self.sampler) - self.start


def build_train_sampler(train_set: Dataset, args: TrainingArguments, rank: int, world_size: int,
                        accumulation_steps: int) -> ResumableSampler:
    """This rank's share of each epoch (--train_sampling_strategy), reordered by set_epoch. Step s trains
    on positions [s x G, (s + 1) x G) of one global order (G: the global batch), however many ranks share
    them: a run can resume on another number of processes."""
    if args.train_sampling_strategy == "group_by_length":
        sampler = DistributedLengthGroupedSampler(
            train_set["length"], args.per_device_train_batch_size, num_replicas=world_size, rank=rank,
            seed=args.seed, drop_last=args.dataloader_drop_last, accumulation_steps=accumulation_steps,
        )
    else:
        sampler = DistributedSampler(
            train_set, num_replicas=world_size, rank=rank, shuffle=args.train_sampling_strategy == "random",
            seed=args.seed, drop_last=args.dataloader_drop_last,
        )
    return ResumableSampler(sampler)


def build_loader(dataset: Dataset, args: TrainingArguments, collator, batch_size: int, on_gpu: bool,
                 sampler: Sampler | None = None) -> DataLoader:
    workers = args.dataloader_num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collator,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory and on_gpu,
        drop_last=args.dataloader_drop_last and sampler is not None,
        persistent_workers=workers > 0 and args.dataloader_persistent_workers,
        worker_init_fn=keep_through_sigterm(),  # so that a SIGTERM to every process leaves time to save
        # Its own generator: starting an epoch then draws no numbers from the global RNG, which
        # stays dropout's alone, so a resumed run draws the same dropout masks as an uninterrupted one.
        generator=torch.Generator().manual_seed(args.seed),
    )


@dataclass(frozen=True)
class BatchPlan:
    """How many examples make one optimizer step, and how many steps make the run."""

    per_device_batch_size: int
    accumulation_steps: int
    world_size: int
    train_size: int
    steps_per_epoch: int
    total_steps: int

    def as_dict(self) -> dict[str, int]:
        """batch_plan.json in each checkpoint, which a resume checks (Checkpointer.load)."""
        split = batch_split(self.world_size, self.per_device_batch_size, self.accumulation_steps)
        return split | {"train_size": self.train_size, "steps_per_epoch": self.steps_per_epoch}


def build_train_batches(
    train_set: Dataset, args: TrainingArguments, collator, rank: int, world_size: int, on_gpu: bool,
    checkpoint: Path | None,
) -> tuple[ResumableSampler, DataLoader, BatchPlan]:
    """This rank's train sampler and loader, and the batch plan they make (resuming `checkpoint`, if any)."""
    per_device = args.per_device_train_batch_size
    accumulation = accumulation_to_resume(checkpoint, per_device, args.gradient_accumulation_steps,
                                          world_size)
    check_batch_fits(len(train_set), world_size, per_device, accumulation)
    sampler = build_train_sampler(train_set, args, rank, world_size, accumulation)
    loader = build_loader(train_set, args, collator, per_device, on_gpu, sampler)
    # At least one full step (check_batch_fits); a last one with fewer micro-batches is still taken.
    steps_per_epoch = math.ceil(len(loader) / accumulation)
    total_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
    plan = BatchPlan(per_device, accumulation, world_size, len(train_set), steps_per_epoch, total_steps)
    logger.info("%d steps of %d examples (%d per device x %d accumulation x %d processes), %d steps per epoch",
                total_steps, per_device * accumulation * world_size, per_device, accumulation, world_size,
                steps_per_epoch)
    return sampler, loader, plan
