"""Predict with a trained model: every row of a file, in order, with its predicted label(s) or value.

    python -m <package>.predict --model_name_or_path OUTPUT_DIR --input_file rows.csv --output_file out.csv

The model's config.json holds its data.Task (problem type, labels, text column(s), max_seq_length), so
predicting on the eval file tokenises exactly as the eval did. Under torchrun (or a launch script with
MODULE=<package>.predict) each rank predicts every world_size-th row of the length-sorted input; rank 0
writes each input row once, in input order, its columns followed by the prediction columns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset, DatasetDict
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, HfArgumentParser, PreTrainedModel

#% if cookiecutter.include_lora
from . import lora
#% endif
from .config import (
    DATA_SUFFIXES,
    ConfigError,
    ModelArguments,
    check_preprocessing_num_workers,
    flag,
    parse_flags,
)
from .data import Task, build_collator, read_files, tokenize_datasets
from .device import resolve_device_settings
from .distributed import (
    cleanup_distributed,
    exit_on_config_error,
    main_process_first,
    setup_logging,
    sharded_forward,
    start_distributed,
)
from .metrics import predict_from_logits
from .modeling import LOAD_OPTIONS, from_pretrained, load_tokenizer
from .torchrun import TorchrunEnv

logger = logging.getLogger(f"{__package__}.predict")


@dataclass
class PredictArguments:
    model_name_or_path: str = field(metadata={"help": "A run's output_dir, or any save_pretrained folder."})
    input_file: str = field(metadata={"help": "csv, json, jsonl or parquet rows to predict."})
    output_file: str = field(metadata={"help": "Where to write them, with predictions (csv/json/jsonl/parquet)."})
    text_column: str | None = flag(None, "Default: the model's training column.")
    text_pair_column: str | None = flag(None, "Default: the model's, if any.")
    multi_label_threshold: float | None = flag(None, "Default: the model's.")
    batch_size: int = flag(64, "Rows per process per batch.")
    use_cpu: bool = flag(False, "Predict on CPU even with a GPU.")
    mixed_precision: str = flag("auto", "As for training.", ["auto", "bf16", "fp16", "no"])
    ddp_timeout: int = flag(1800, "Seconds before a stuck collective fails.")
    preprocessing_num_workers: int | None = flag(None, "Processes for tokenising, as for training.")

    def __post_init__(self) -> None:
        for name in ("input_file", "output_file"):
            if not getattr(self, name).endswith(DATA_SUFFIXES):
                raise ConfigError(f"--{name} {getattr(self, name)!r}: use .csv, .json, .jsonl or .parquet")
        if self.batch_size < 1:
            raise ConfigError(f"--batch_size {self.batch_size}: must be >= 1")
        check_preprocessing_num_workers(self.preprocessing_num_workers)


def main(argv: list[str] | None = None) -> None:
    parser = HfArgumentParser(PredictArguments, prog=f"python -m {__package__}.predict")
    with exit_on_config_error():
        (args,) = parse_flags(parser, argv)
        settings = resolve_device_settings(args.mixed_precision, use_cpu=args.use_cpu)
        setup_logging(TorchrunEnv.read().is_main_process)
        # One process and several GPUs: it predicts on the first; torchrun shares the rows among them all.
        device = start_distributed(settings, args.ddp_timeout, several_gpus="first")
        try:
            model, tokenizer, task = load_trained_model(args.model_name_or_path, device)
            task = replace(task, **{name: getattr(args, name) for name in
                                    ("text_column", "text_pair_column", "multi_label_threshold")
                                    if getattr(args, name) is not None})
            predict_file(model, tokenizer, task, args.input_file, args.output_file, args.batch_size, device,
                         settings.precision, num_proc=args.preprocessing_num_workers)
        finally:
            cleanup_distributed()


def load_trained_model(path: str, device: torch.device) -> tuple[PreTrainedModel, object, Task]:
    """A trained model, its tokenizer and task."""
    #% if cookiecutter.include_lora
    lora.refuse_adapter_without_base(path)  # a LoRA run's output_dir loads whole, its checkpoint-N does not
    #% endif
    if Path(path, "model_and_optimizer").is_dir():  # the native loop's checkpoint-N (checkpoint.py)
        raise ConfigError(f"--model_name_or_path {path!r} is a checkpoint to resume from, its weights sharded in "
                          "model_and_optimizer/: predict from the run's output_dir, which holds the final model")
    model = from_pretrained(AutoModelForSequenceClassification, path, **LOAD_OPTIONS)
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=path))
    task = Task.from_config(model.config)  # a model trained elsewhere has none: the defaults, within its limit
    task = replace(task, max_seq_length=min(task.max_seq_length, tokenizer.model_max_length))
    return model.to(device).eval(), tokenizer, task


def predict_file(model: PreTrainedModel, tokenizer, task: Task, input_file: str, output_file: str,
                 batch_size: int, device: torch.device, precision: str = "no",
                 num_proc: int | None = None) -> Path | None:
    """Predict every row of input_file; rank 0 writes them to output_file and returns its path. Every
    process of the group calls it: rank 0 reads and tokenises first (in num_proc processes), the others
    then read its cache; each predicts its share and rank 0 gathers them."""
    with main_process_first():
        rows = read_files({"input": input_file})["input"]
        for name, column in (("text_column", task.text_column), ("text_pair_column", task.text_pair_column)):
            if column is not None and column not in rows.column_names:
                raise ConfigError(f"--{name} {column!r} is not a column of {input_file}; columns are: "
                                  f"{', '.join(rows.column_names)}")
        tokenized = tokenize_datasets(DatasetDict(input=rows), tokenizer, task, num_proc=num_proc)
    batches = partial(DataLoader, batch_size=batch_size,
                      collate_fn=build_collator(tokenizer, mixed_precision=precision != "no"))
    outputs = sharded_forward(model, tokenized["input"], batches, device, precision)
    if outputs is None:  # not rank 0
        return None
    path = write_rows(rows, prediction_columns(outputs[0], task), output_file)
    logger.info("%d predictions written to %s", len(rows), path)
    return path


def prediction_columns(logits: np.ndarray, task: Task) -> dict[str, list]:
    """`prediction`: the label name, the set of label names (multi-label) or the value (regression);
    `score`: the predicted class's probability, or one `score_<label>` per label for multi-label."""
    predictions, scores = predict_from_logits(logits, task.problem_type, task.multi_label_threshold)
    if task.problem_type == "regression":
        return {"prediction": predictions.tolist()}
    if task.problem_type == "multi_label_classification":
        columns = {"prediction": [[task.label_names[i] for i in np.flatnonzero(row)] for row in predictions]}
        columns.update({f"score_{name}": scores[:, i].tolist() for i, name in enumerate(task.label_names)})
        return columns
    return {"prediction": [task.label_names[i] for i in predictions], "score": scores.tolist()}


def write_rows(rows: Dataset, columns: dict[str, list], output_file: str) -> Path:
    taken = sorted(set(columns) & set(rows.column_names))
    if taken:
        raise ConfigError(f"--input_file already has column(s) {', '.join(taken)}, which the predictions "
                          "would replace: rename them")
    if output_file.endswith(".csv"):  # a cell holds no list: a label set becomes "a|b"
        columns = {name: ["|".join(value) if isinstance(value, list) else value for value in values]
                   for name, values in columns.items()}
    for name, values in columns.items():
        rows = rows.add_column(name, values)
    path = Path(output_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        rows.to_parquet(path)
    elif path.suffix == ".csv":
        rows.to_csv(path)
    else:  # .jsonl: one object per line; .json: one array
        # One batch: datasets writes an array (lines=False) only when the whole of it fits in one.
        rows.to_json(path, lines=path.suffix == ".jsonl", batch_size=max(len(rows), 1), force_ascii=False)
    return path


if __name__ == "__main__":
    main()
