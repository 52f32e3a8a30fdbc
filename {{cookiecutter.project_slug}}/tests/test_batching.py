"""The native loop's data plumbing, in process: which examples each rank trains on, and the batch plan.
A sampler is built once per rank, as every rank does under torchrun, and the ranks' shards compared."""

from __future__ import annotations

import random

import pytest
from conftest import package_module
from datasets import Dataset

batching = package_module("batching")
ConfigError = package_module("config").ConfigError
TrainingArguments = package_module("training_args").TrainingArguments
DistributedLengthGroupedSampler = batching.DistributedLengthGroupedSampler

BATCH = 4


def lognormal_lengths(count: int, seed: int = 0) -> list[int]:
    """Long-tailed like real reviews (and like the smoke data)."""
    rng = random.Random(seed)
    return [min(120, max(6, int(rng.lognormvariate(3.0, 0.7)))) for _ in range(count)]


def shards(lengths: list[int], world_size: int, epoch: int = 0, seed: int = 1, **options) -> list[list[int]]:
    """Each rank's indices, from a sampler built on its own, as every rank does."""
    result = []
    for rank in range(world_size):
        sampler = DistributedLengthGroupedSampler(lengths, BATCH, num_replicas=world_size, rank=rank, seed=seed,
                                                  **options)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        assert len(indices) == len(sampler)
        result.append(indices)
    return result


# ---- the length-grouped distributed sampler ----------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_length_grouped_shards_partition_the_data_when_divisible(world_size: int) -> None:
    lengths = lognormal_lengths(48)  # 48 is divisible by 1, 2, 3 and 4
    for epoch in (0, 1):
        per_rank = shards(lengths, world_size, epoch)
        assert [len(shard) for shard in per_rank] == [48 // world_size] * world_size
        assert sorted(i for shard in per_rank for i in shard) == list(range(48))  # disjoint and covering


@pytest.mark.parametrize("count", [53, 103], ids=["prime", "odd-with-partial-last-batch"])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_length_grouped_shards_cover_everything_with_minimal_repeats_when_not_divisible(
    world_size: int, count: int
) -> None:
    lengths = lognormal_lengths(count)
    per_rank = shards(lengths, world_size)
    per_rank_len = -(-count // world_size)  # padded so every rank runs the same number of batches
    assert [len(shard) for shard in per_rank] == [per_rank_len] * world_size
    everything = [i for shard in per_rank for i in shard]
    assert set(everything) == set(range(count))
    assert len(everything) - count == per_rank_len * world_size - count  # only the padding repeats
    dropped = shards(lengths, world_size, drop_last=True)
    assert [len(shard) for shard in dropped] == [count // world_size] * world_size
    flat = [i for shard in dropped for i in shard]
    assert len(set(flat)) == len(flat) == count - count % world_size


def test_length_grouped_order_is_the_same_on_every_rank_new_each_epoch_and_steps_line_up() -> None:
    lengths = lognormal_lengths(64)
    per_rank = shards(lengths, 2, epoch=3)
    assert per_rank == shards(lengths, 2, epoch=3)  # rebuilt from scratch: identical
    assert per_rank != shards(lengths, 2, epoch=4) and per_rank != shards(lengths, 2, epoch=3, seed=2)
    # Step k on each rank is its slice of one length-sorted global batch: rank 0's shortest is at
    # least rank 1's longest, so the ranks meet at the all-reduce with similar work.
    for step in range(0, len(per_rank[0]), BATCH):
        rank0, rank1 = ([lengths[i] for i in shard[step:step + BATCH]] for shard in per_rank)
        assert min(rank0) >= max(rank1)
    assert lengths[per_rank[0][0]] == max(lengths)  # the longest step first: out of memory at once
    with pytest.raises(ValueError, match=r"rank 2 is outside \[0, 2\)"):
        DistributedLengthGroupedSampler([5] * 8, BATCH, num_replicas=2, rank=2)


# ---- resuming part-way through an epoch --------------------------------------------------------

def test_resumable_sampler_starts_the_epoch_after_the_examples_already_trained_on() -> None:
    lengths = lognormal_lengths(103)
    sampler = batching.ResumableSampler(DistributedLengthGroupedSampler(lengths, BATCH, num_replicas=2, rank=1,
                                                                        seed=1))
    sampler.set_epoch(2)
    whole = list(sampler)
    sampler.set_epoch(2, start=12)
    assert list(sampler) == whole[12:]
    assert len(sampler) == len(whole) - 12
    sampler.set_epoch(3)  # the next epoch starts at its beginning again
    assert len(list(sampler)) == len(whole)


# ---- the train sampler, loader and batch plan --------------------------------------------------

def train_batches(count: int, world_size: int, rank: int = 0, **flags):
    """(sampler, loader, plan) for one rank, as the native loop builds them."""
    train_set = Dataset.from_dict(dict(length=lognormal_lengths(count)))
    args = TrainingArguments(**{"per_device_train_batch_size": BATCH, **flags})
    return batching.build_train_batches(train_set, args, collator=None, rank=rank, world_size=world_size,
                                        on_gpu=False, checkpoint=None)


def test_plan_counts_a_short_last_window_and_refuses_a_step_larger_than_the_data() -> None:
    # 100 examples over 2 ranks: 50 each, 13 micro-batches of 4 (the last holds 2); 13 / 3 -> 5 steps.
    _, loader, plan = train_batches(100, 2, gradient_accumulation_steps=3, num_train_epochs=2)
    assert len(loader) == 13
    assert (plan.steps_per_epoch, plan.total_steps) == (5, 10)
    assert plan.as_dict()["global_batch_size"] == BATCH * 3 * 2
    assert train_batches(100, 2, gradient_accumulation_steps=3, max_steps=7)[2].total_steps == 7  # wins over epochs
    # The global batch counts the accumulation steps, as the preflight and the Trainer count it.
    with pytest.raises(ConfigError, match=r"^one optimizer step takes 16 examples \(2 process\(es\) x "
                                          r"--per_device_train_batch_size 4 x --gradient_accumulation_steps 2\), "
                                          r"more than the 15 train examples"):
        train_batches(15, 2, gradient_accumulation_steps=2)
    assert train_batches(16, 2, gradient_accumulation_steps=2)[2].steps_per_epoch == 1


@pytest.mark.parametrize("strategy", ["group_by_length", "random", "sequential"])
def test_each_step_holds_the_same_examples_however_the_global_batch_is_split(strategy: str) -> None:
    """2 processes x batch 4 and 1 process x batch 4 x 2 accumulation: the same 8 examples in each full step,
    also where 2 processes pad the epoch (79 examples), so a run resumes on another number of processes."""
    two_ranks = [list(train_batches(79, 2, rank, train_sampling_strategy=strategy)[0]) for rank in (0, 1)]
    one_rank = list(train_batches(79, 1, 0, train_sampling_strategy=strategy, gradient_accumulation_steps=2)[0])
    assert sorted(one_rank) == list(range(79))
    steps = 79 // (2 * BATCH)
    assert [sorted(two_ranks[0][s * BATCH:(s + 1) * BATCH] + two_ranks[1][s * BATCH:(s + 1) * BATCH])
            for s in range(steps)] == [sorted(one_rank[s * 2 * BATCH:(s + 1) * 2 * BATCH]) for s in range(steps)]
