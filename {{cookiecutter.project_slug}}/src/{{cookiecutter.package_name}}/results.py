"""How both loops end a run: what it leaves in output_dir once it has trained or evaluated.

With --do_predict every rank predicts a share of --test_file and rank 0 writes output_dir/predictions.<suffix>
(predict.py). Then rank 0 writes metrics.json and, after training, log_history.json (every logged line) and
training_curves.png; an evaluation alone keeps the history and curves of the run it evaluated.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .compat import compile_counts
from .data import Task
from .metrics import plot_training_curves, scalars, write_metrics
from .predict import predict_file

logger = logging.getLogger(f"{__package__}.train")  # the lines belong to the training run's log


def write_results(args, metrics: dict, history: list[dict], is_main_process: bool, model: PreTrainedModel,
                  tokenizer: PreTrainedTokenizerBase, task: Task, test_file: str | None, device: torch.device,
                  precision: str, num_proc: int | None = None) -> None:
    """Every rank calls it, with the loop's TrainingArguments; num_proc is --preprocessing_num_workers."""
    if args.do_predict:
        output_file = str(Path(args.output_dir, "predictions" + Path(test_file).suffix))
        predict_file(model, tokenizer, task, test_file, output_file, args.per_device_eval_batch_size, device,
                     precision, num_proc=num_proc)
    if not is_main_process:
        return
    if args.torch_compile:
        metrics = metrics | compile_counts()
    path = write_metrics(args.output_dir, metrics, trained=args.do_train)
    if args.do_train:
        Path(args.output_dir, "log_history.json").write_text(json.dumps(history, indent=1) + "\n")
        plot_training_curves(history, Path(args.output_dir, "training_curves.png"))
    logger.info("metrics written to %s: %s", path, scalars(metrics))
