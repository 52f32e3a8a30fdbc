"""Check a run's settings and data in one process, before torchrun starts any worker.

The launcher (torchrun.py) runs this in a fork of itself, with the train module's arguments, for the
PREFLIGHT_WORLD_SIZE processes the launch scripts will start: a bad setting, missing data, a model or a
checkpoint that does not fit then ends with one `error:` line and exit status 2, not in every worker and
torchrun's traceback. The workers check the same things again (their files may differ from this node's).
`python -m <package>.preflight CONFIG [--flag value ...]` runs it alone.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

#% if cookiecutter.include_lora
from . import lora
#% endif
from .config import DataArguments, ModelArguments, check_batch_fits, check_local_path, parse_args
from .data import decide_task, load_raw_datasets
from .device import training_device_settings
from .distributed import exit_on_config_error, setup_logging
from .modeling import check_labels_fit, check_model_settings, load_tokenizer
from .resume import accumulation_to_resume, agree_on_resume_checkpoint
from .training_args import CHECKPOINT_LAST_FILE, TrainingArguments

logger = logging.getLogger(f"{__package__}.preflight")


def main(argv: list[str] | None = None) -> None:
    with exit_on_config_error():
        world_size = int(os.environ.get("PREFLIGHT_WORLD_SIZE", "1"))
        model_args, data_args, args = parse_args(TrainingArguments, argv)
        setup_logging(is_main_process=True)
        check(model_args, data_args, args, world_size)


def check(model_args: ModelArguments, data_args: DataArguments, args: TrainingArguments, world_size: int) -> None:
    # Parsing checked the batch sizes and steps; the loops call the same functions. The precision this
    # node's GPUs support is queried without claiming one (in a fork: the launcher stays clear of CUDA).
    settings = training_device_settings(args)
    check_local_path(model_args.model_name_or_path)
    load_tokenizer(model_args)  # checks its path too, and refuses one with neither a pad nor an eos token
    check_model_settings(model_args, args.gradient_checkpointing)
    raw = load_raw_datasets(data_args, model_args.cache_dir, seed=args.seed)  # also fills the workers' cache
    task = decide_task(raw, data_args)
    if not model_args.ignore_mismatched_sizes:
        check_labels_fit(Path(model_args.model_name_or_path), task, "--model_name_or_path")
    if args.do_train:
        checkpoint = agree_on_resume_checkpoint(args.resume_from_checkpoint, args.output_dir, CHECKPOINT_LAST_FILE)
        if checkpoint is not None:
            check_labels_fit(checkpoint, task, "checkpoint", same_names=True)
            #% if cookiecutter.include_lora
            lora.check_same_rank(checkpoint, model_args.lora_r)
            #% endif
        # A checkpoint's global batch on this many processes (a requeued job may come back on fewer nodes).
        accumulation = accumulation_to_resume(checkpoint, args.per_device_train_batch_size,
                                              args.gradient_accumulation_steps, world_size)
        check_batch_fits(len(raw["train"]), world_size, args.per_device_train_batch_size, accumulation)
    device = "CPU" if settings.use_cpu else f"{torch.cuda.device_count()} GPU(s)"
    logger.info("preflight: %d train and %d eval examples, %s, labels %s, %d process(es) on %s, precision %s: "
                "settings and data look right", len(raw["train"]), len(raw["validation"]), task.problem_type,
                task.label_names or "none", world_size, device, settings.precision)


if __name__ == "__main__":
    main()
