"""The native loop's step in this process (no torchrun): a loader shorter than the batch plan, a step the fp16
GradScaler skips, what a checkpoint must hold. Two processes, trained for real: the template's proofs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import package_module, smoke_flags

batching = package_module("batching")
config = package_module("config")
train = package_module("train")


@pytest.fixture
def build_job(smoke_assets: Path, tmp_path: Path, isolated_process):
    """A Job built here, in this process (no torchrun): build_job(*flags) on top of the smoke config."""

    def build(*flags: str):
        model_args, data_args, args = config.parse_args(train.TrainingArguments,
                                                        [*smoke_flags(smoke_assets, tmp_path), *flags])
        return train.build_job(*train.setup_distributed(args), model_args, data_args, args)
    return build


def test_a_loader_that_runs_out_before_the_plan_is_an_internal_error(build_job) -> None:
    """The batch plan promises every step its micro-batches; a shorter loader must stop the run, not step on nothing."""
    job = build_job()
    args = job.args
    job.train_loader = batching.build_loader(job.data.train.select(range(32)), args, job.collator,
                                             args.per_device_train_batch_size, on_gpu=False)
    with pytest.raises(RuntimeError, match=r"the train loader ran out before step 3 \(epoch 0\)"):
        train.train(job)


@pytest.mark.parametrize("logging_steps", ["1", "2"])
def test_a_step_the_grad_scaler_skips_leaves_the_schedule_where_it_was(build_job, logging_steps: str) -> None:
    """fp16: a step with inf gradients is skipped by the GradScaler (fused AdamW is still called); the
    learning-rate schedule must not count it. The loop reads the skip at the next log line, at once (every
    step logged) or a step later. The CPU scaler stands in for CUDA's."""
    job = build_job("--max_steps", "3", "--save_strategy", "no", "--do_eval", "false", "--logging_steps", logging_steps)
    job.scaler = torch.amp.GradScaler("cpu")
    weight = job.module.classifier.weight
    poison = weight.register_hook(lambda grad: (poison.remove(), torch.full_like(grad, float("inf")))[1])
    train.train(job)
    assert job.step == 3
    assert job.scheduler.last_epoch == 2, "the schedule counted the skipped step"
    assert job.scaler.get_scale() == 2.0**16 / 2, "the scaler did not see the inf gradients"
    # The smoke config warms up over 4 steps: the rate after k scheduler steps is learning_rate * k / 4,
    # and after step s, one of them skipped, k is s - 1.
    logged = {entry["step"]: entry["learning_rate"] for entry in job.history}
    assert logged == pytest.approx({step: job.args.learning_rate * (step - 1) / 4 for step in logged})
    assert list(logged) == ([1, 2, 3] if logging_steps == "1" else [2, 3])


def test_a_checkpoint_of_one_process_is_saved_and_read_without_warnings(build_job, recwarn) -> None:
    """torch.distributed.checkpoint warns at each save and load without a process group: one process means it."""
    job = build_job("--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2", "--do_eval", "false")
    train.train(job)
    saved = Path(job.args.output_dir) / "checkpoint-2"
    job.checkpointer.load(saved)
    assert [str(warning.message) for warning in recwarn] == []
