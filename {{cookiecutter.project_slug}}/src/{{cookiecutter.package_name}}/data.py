"""Loading, label mapping and tokenising; shared by both training loops."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
from datasets import ClassLabel, Dataset, DatasetDict
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from .config import ConfigError, DataArguments
from .distributed import main_process_first

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")
FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClassificationData:
    train: Dataset  # tokenised, with "labels" and "length" columns
    validation: Dataset
    label_names: list[str]  # in id order


def load_data(
    data_args: DataArguments, tokenizer: PreTrainedTokenizerBase, cache_dir: str | None, seed: int
) -> ClassificationData:
    """Load, map labels and tokenise. Rank 0 goes first; the others then read its cache."""
    source = data_args.train_file or data_args.dataset_name
    with main_process_first():
        raw = load_raw_datasets(data_args, cache_dir, seed=seed)
        names = label_names(raw, data_args.label_column)
        tokenized = tokenize_datasets(raw, tokenizer, data_args, names)
    logger.info("data from %s: %d train examples, %d eval examples, labels %s", source, len(tokenized["train"]),
                len(tokenized["validation"]), names)
    return ClassificationData(tokenized["train"], tokenized["validation"], names)


def load_raw_datasets(data_args: DataArguments, cache_dir: str | None = None, seed: int = 42) -> DatasetDict:
    """Return a DatasetDict with "train" and "validation" from local files or the Hub."""
    if data_args.train_file is not None:
        files = {"train": data_args.train_file}
        if data_args.validation_file is not None:
            files["validation"] = data_args.validation_file
        for split, path in files.items():
            if not Path(path).is_file():
                raise ConfigError(f"--{split if split == 'train' else 'validation'}_file {path!r} not found")
        builder = FILE_BUILDERS[Path(data_args.train_file).suffix]
        try:
            raw = datasets.load_dataset(builder, data_files=files, cache_dir=cache_dir)
        except Exception as err:  # datasets raises many types for a malformed file
            raise ConfigError(f"could not read {', '.join(files.values())} as {builder}: {err}") from None
    else:
        try:
            raw = datasets.load_dataset(
                data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir
            )
        except Exception as err:
            raise ConfigError(
                f"--dataset_name {data_args.dataset_name!r} could not be loaded: {err}. "
                "Offline? Pass local files with --train_file/--validation_file."
            ) from None

    if "validation" not in raw:
        if "test" in raw:
            raw["validation"] = raw["test"]
        else:
            held_out = raw["train"].train_test_split(
                test_size=data_args.validation_split_percentage / 100, seed=seed
            )
            raw["train"], raw["validation"] = held_out["train"], held_out["test"]
    raw = DatasetDict({"train": raw["train"], "validation": raw["validation"]})

    for split, dataset in raw.items():
        for flag, column in (("text_column", data_args.text_column), ("label_column", data_args.label_column)):
            if column not in dataset.column_names:
                raise ConfigError(
                    f"--{flag} {column!r} is not a column of the {split} split; "
                    f"columns are: {', '.join(dataset.column_names)}"
                )
    if data_args.max_train_samples is not None:
        raw["train"] = raw["train"].select(range(min(data_args.max_train_samples, len(raw["train"]))))
    if data_args.max_eval_samples is not None:
        raw["validation"] = raw["validation"].select(range(min(data_args.max_eval_samples, len(raw["validation"]))))
    return raw


def label_names(raw: DatasetDict, label_column: str) -> list[str]:
    """Class names in id order: a ClassLabel's names, else the sorted distinct values of train."""
    feature = raw["train"].features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = set(raw["train"].unique(label_column))
    if None in values:
        raise ConfigError(f"--label_column {label_column!r} has empty values in the train split")
    unseen = set(raw["validation"].unique(label_column)) - values
    if unseen:
        raise ConfigError(
            f"--label_column {label_column!r}: validation has labels not seen in train: {sorted(map(str, unseen))}"
        )
    return [str(value) for value in sorted(values)]


def tokenize_datasets(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    data_args: DataArguments,
    names: list[str],
) -> DatasetDict:
    """Tokenise, map labels to ids and record each example's length."""
    feature = raw["train"].features[data_args.label_column]
    label2id = None if isinstance(feature, ClassLabel) else {name: i for i, name in enumerate(names)}
    max_length = min(data_args.max_seq_length, tokenizer.model_max_length)

    def encode(batch: dict) -> dict:
        encoded = tokenizer(batch[data_args.text_column], truncation=True, max_length=max_length)
        labels = batch[data_args.label_column]
        encoded["labels"] = labels if label2id is None else [label2id[str(label)] for label in labels]
        # The length-grouped samplers read this column instead of re-measuring every example.
        encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
        return encoded

    return raw.map(
        encode,
        batched=True,
        num_proc=data_args.preprocessing_num_workers,
        remove_columns=raw["train"].column_names,
        desc="Tokenizing",
    )


class ClassificationCollator(DataCollatorWithPadding):
    """Dynamic padding that keeps only what the model takes (drops helper columns such as length)."""

    def __call__(self, features: list[dict]) -> dict:
        features = [{key: value for key, value in f.items() if key in MODEL_INPUTS} for f in features]
        return super().__call__(features)


def build_collator(tokenizer: PreTrainedTokenizerBase, mixed_precision: bool) -> ClassificationCollator:
    # Multiples of 8 let tensor cores run the padded matmuls at full speed.
    return ClassificationCollator(tokenizer, pad_to_multiple_of=8 if mixed_precision else None)
