"""Fine-tune a sequence classifier with the Hugging Face Trainer, on one process or under torchrun.

The run, top to bottom: parse the config and flags; check that torchrun's ranks really share
gradients; load and tokenise the data; load the model; train, resuming from the newest checkpoint;
evaluate once over exactly the eval set; write metrics.json.
"""

from __future__ import annotations

import logging
import os
import sys
from functools import partial

import datasets
import numpy as np
import transformers
from transformers import EvalPrediction, Trainer, TrainerCallback, set_seed
from transformers.trainer_utils import get_last_checkpoint

from .config import ConfigError, DataArguments, ModelArguments, TrainingArguments, parse_args
from .data import build_collator, label_names, load_raw_datasets, tokenize_datasets
from .distributed import (
    assert_gradients_synchronised,
    broadcast_from_main,
    check_really_distributed,
    cleanup_distributed,
    set_process_group_timeout,
)
from .metrics import classification_metrics, write_metrics
from .modeling import load_model, load_tokenizer

logger = logging.getLogger(__name__)


class GradientSyncCheck(TrainerCallback):
    """Before the first optimizer step, prove every rank holds the same averaged gradients."""

    def __init__(self) -> None:
        self.checked = False

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.checked:
            assert_gradients_synchronised(model)
            self.checked = True


def setup_logging(training_args: TrainingArguments) -> None:
    """Log from rank 0; the other ranks report warnings and errors only."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    # "passive" leaves the libraries at warning; this script's own progress lines still show on rank 0.
    logger.setLevel(logging.INFO if training_args.should_log and training_args.log_level == "passive" else log_level)
    transformers.utils.logging.set_verbosity(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    if not training_args.should_log:
        datasets.disable_progress_bars()


def compute_metrics(prediction: EvalPrediction, num_labels: int) -> dict[str, float]:
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    return classification_metrics(np.argmax(logits, axis=-1), prediction.label_ids, num_labels)


def build_trainer(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: TrainingArguments,
    callbacks: list[TrainerCallback] | None = None,
) -> Trainer:
    raw = load_raw_datasets(data_args, model_args.cache_dir, seed=training_args.seed)
    names = label_names(raw, data_args.label_column)
    tokenizer = load_tokenizer(model_args)
    tokenized = tokenize_datasets(raw, tokenizer, data_args, names)
    logger.info("train examples: %d, eval examples: %d, labels: %s", len(tokenized["train"]),
                len(tokenized["validation"]), names)
    model = load_model(model_args, names)
    return Trainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"],
        eval_dataset=tokenized["validation"],
        processing_class=tokenizer,
        data_collator=build_collator(tokenizer, mixed_precision=training_args.fp16 or training_args.bf16),
        compute_metrics=partial(compute_metrics, num_labels=len(names)),
        callbacks=[GradientSyncCheck(), *(callbacks or [])],
    )


def find_resume_checkpoint(training_args: TrainingArguments) -> str | None:
    """--resume_from_checkpoint if given, else the newest checkpoint-N in output_dir, else None.

    Rank 0 decides for all: ranks that resumed from different steps would wait on each other forever.
    """
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint is None and os.path.isdir(training_args.output_dir):
        checkpoint = get_last_checkpoint(training_args.output_dir)
    checkpoint = broadcast_from_main(checkpoint)
    if checkpoint is not None and not os.path.isdir(checkpoint):
        raise ConfigError(
            f"checkpoint {checkpoint!r} is not a folder on this node; with several nodes, "
            "--output_dir must be on a filesystem every node shares"
        )
    return checkpoint


def prepare_run(training_args: TrainingArguments) -> None:
    setup_logging(training_args)
    check_really_distributed(training_args.world_size)
    set_process_group_timeout(training_args.ddp_timeout)
    logger.info(
        "world size %d, device %s, backend %s, precision %s",
        training_args.world_size,
        training_args.device,
        training_args.ddp_backend,
        "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32",
    )
    set_seed(training_args.seed)


def train_and_evaluate(trainer: Trainer, training_args: TrainingArguments) -> dict[str, float]:
    checkpoint = find_resume_checkpoint(training_args)
    if checkpoint is not None:
        logger.info("Resuming from checkpoint %s", checkpoint)
    train_result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    trainer.save_state()

    # Trainer's evaluation gathers with gather_for_metrics, which drops the examples the
    # distributed sampler repeats to even out the ranks: every example counts exactly once.
    metrics = trainer.evaluate()
    metrics.update(train_result.metrics)
    if trainer.is_world_process_zero():
        path = write_metrics(training_args.output_dir, metrics)
        logger.info("metrics written to %s: %s", path, metrics)
    return metrics


def run(model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments) -> Trainer:
    prepare_run(training_args)
    trainer = build_trainer(model_args, data_args, training_args)
    train_and_evaluate(trainer, training_args)
    return trainer


def release(trainer: Trainer) -> None:
    """Drop the Trainer's DDP wrapper, then the process group, so every rank exits cleanly."""
    trainer.accelerator.free_memory()
    trainer.model_wrapped = trainer.model
    cleanup_distributed()


def main(argv: list[str] | None = None) -> None:
    try:
        trainer = run(*parse_args(argv))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    release(trainer)


if __name__ == "__main__":
    main()
