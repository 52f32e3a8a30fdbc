"""Fine-tune a sequence classifier with the Hugging Face Trainer, on one process or under torchrun.

The run, top to bottom: parse the config and flags (under torchrun this starts the process group,
through accelerate); check that torchrun's ranks really share gradients; load and tokenise the data;
load the model; train, resuming from the newest checkpoint; evaluate once over exactly the eval set;
write metrics.json.
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path

import numpy as np
import torch.distributed as dist
from transformers import EvalPrediction, Trainer, TrainerCallback, set_seed
from transformers.trainer_utils import get_last_checkpoint

from .config import ConfigError, DataArguments, ModelArguments, parse_args
from .data import build_collator, load_data
from .distributed import (
    agree_on_resume_checkpoint,
    assert_gradients_synchronised,
    cleanup_distributed,
    env_world_size,
    setup_logging,
)
from .metrics import classification_metrics, write_metrics
from .modeling import load_model, load_tokenizer
from .training_args import TrainingArguments

logger = logging.getLogger(f"{__package__}.train")  # not __name__: that is "__main__" under python -m


def main(argv: list[str] | None = None) -> None:
    try:
        trainer = run(*parse_args(TrainingArguments, argv))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    release(trainer)


def run(model_args: ModelArguments, data_args: DataArguments, args: TrainingArguments) -> Trainer:
    prepare_run(args)
    trainer = build_trainer(model_args, data_args, args)
    train_and_evaluate(trainer, args)
    return trainer


def prepare_run(args: TrainingArguments) -> None:
    setup_logging(args.process_index == 0)
    check_really_distributed(args.world_size)
    if dist.is_initialized():
        # accelerate started the group without --ddp_timeout on CPU. There is no public setter;
        # _set_pg_timeout is torch's own helper for exactly this.
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=args.ddp_timeout))
    logger.info("world size %d, device %s, backend %s, precision %s", args.world_size, args.device,
                args.ddp_backend, "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    set_seed(args.seed)


def check_really_distributed(world_size_in_use: int) -> None:
    """Fail loudly when torchrun started several processes but each would train alone."""
    expected = env_world_size()
    group_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if expected > 1 and (group_size != expected or world_size_in_use != expected):
        raise RuntimeError(
            f"WORLD_SIZE={expected} but this process would train with world size {world_size_in_use} "
            f"(process group size {group_size}): the ranks would not share gradients. "
            "On CPU pass --use_cpu true and --ddp_backend gloo; on GPU check that CUDA is visible to every rank."
        )


class GradientSyncCheck(TrainerCallback):
    """Before the first optimizer step, prove every rank holds the same averaged gradients."""

    def __init__(self) -> None:
        self.checked = False

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.checked:
            assert_gradients_synchronised(model)
            self.checked = True


def compute_metrics(prediction: EvalPrediction, num_labels: int) -> dict[str, float]:
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return classification_metrics(np.argmax(logits, axis=-1), prediction.label_ids, num_labels)


def build_trainer(model_args: ModelArguments, data_args: DataArguments, args: TrainingArguments) -> Trainer:
    tokenizer = load_tokenizer(model_args)
    data = load_data(data_args, tokenizer, model_args.cache_dir, args.seed)
    model = load_model(model_args, data.label_names)
    # Classification heads take **kwargs but ignore num_items_in_batch and return a per-batch mean.
    # If the Trainer believed otherwise it would multiply the loss (and the gradients) by the world
    # size and skip dividing by the accumulation steps.
    model.accepts_loss_kwargs = False
    return Trainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.validation,
        processing_class=tokenizer,
        data_collator=build_collator(tokenizer, mixed_precision=args.fp16 or args.bf16),
        compute_metrics=partial(compute_metrics, num_labels=len(data.label_names)),
        callbacks=[GradientSyncCheck()],
    )


def find_resume_checkpoint(args: TrainingArguments) -> Path | None:
    """--resume_from_checkpoint, else the newest checkpoint-N in output_dir; the same on every rank."""
    def newest() -> Path | None:
        found = get_last_checkpoint(args.output_dir) if Path(args.output_dir).is_dir() else None
        return Path(found) if found is not None else None

    return agree_on_resume_checkpoint(args.resume_from_checkpoint, newest,
                                      lambda path: None if path.is_dir() else "does not exist")


def train_and_evaluate(trainer: Trainer, args: TrainingArguments) -> dict[str, float]:
    metrics = {}
    if args.do_train:
        checkpoint = find_resume_checkpoint(args)
        if checkpoint is not None:
            logger.info("resuming from checkpoint %s", checkpoint)
        metrics.update(trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None).metrics)
        trainer.save_model()
        trainer.save_state()
    if args.do_eval:
        # Trainer's evaluation gathers with gather_for_metrics, which drops the examples the
        # distributed sampler repeats to even out the ranks: every example counts exactly once.
        metrics.update(trainer.evaluate())
    if trainer.is_world_process_zero():
        path = write_metrics(args.output_dir, metrics)
        logger.info("metrics written to %s: %s", path, metrics)
    return metrics


def release(trainer: Trainer) -> None:
    """Drop the Trainer's DDP wrapper, then the process group, so every rank exits cleanly."""
    trainer.accelerator.free_memory()
    trainer.model_wrapped = trainer.model
    cleanup_distributed()


if __name__ == "__main__":
    main()
