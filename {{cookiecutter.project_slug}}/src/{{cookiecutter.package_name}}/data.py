"""Loading, the task (problem type and labels), tokenising, grouping by length: for both loops and predict."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from itertools import chain
from pathlib import Path

import datasets
import torch
from datasets import ClassLabel, Dataset, DatasetDict, LargeList, List, Value
from transformers import DataCollatorWithPadding, PreTrainedConfig, PreTrainedTokenizerBase

from .config import FILE_BUILDERS, ConfigError, DataArguments
from .distributed import main_process_first
from .torchrun import TorchrunEnv

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")
TASK_CONFIG_KEY = "classification_inputs"  # the Task's inputs, in the model's config.json

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """What the model learns and which columns it reads. The model's config records it (as_config), so
    that a saved model predicts on its own (predict.py reads it back: from_config)."""

    problem_type: str  # one of config.PROBLEM_TYPES, not auto
    label_names: list[str]  # in id order; empty for regression
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    label_delimiter: str | None = None
    max_seq_length: int = 512  # as used: --max_seq_length, at most the tokenizer's limit
    multi_label_threshold: float = 0.5

    @property
    def num_labels(self) -> int:
        return 1 if self.problem_type == "regression" else len(self.label_names)

    def as_config(self) -> dict:
        inputs = {k: v for k, v in asdict(self).items() if k not in ("problem_type", "label_names")}
        return {"problem_type": self.problem_type, TASK_CONFIG_KEY: inputs}

    @classmethod
    def from_config(cls, config: PreTrainedConfig) -> Task:
        problem_type = config.problem_type or "single_label_classification"
        names = [] if problem_type == "regression" else [config.id2label[i] for i in range(config.num_labels)]
        return cls(problem_type, names, **(getattr(config, TASK_CONFIG_KEY, None) or {}))


@dataclass(frozen=True)
class ClassificationData:
    task: Task
    train: Dataset  # tokenised, with "labels", "length" and "truncated" columns (--test_file: predict.py)
    validation: Dataset

    @property
    def label_names(self) -> list[str]:
        return self.task.label_names


def load_data(data_args: DataArguments, tokenizer: PreTrainedTokenizerBase, cache_dir: str | None,
              seed: int) -> ClassificationData:
    """Rank 0 loads, decides the task and tokenises first; the others then read its cache."""
    with main_process_first():
        raw = load_raw_datasets(data_args, cache_dir, seed=seed)
        task = decide_task(raw, data_args, tokenizer.model_max_length)
        tokenized = tokenize_datasets(DatasetDict(train=raw["train"], validation=raw["validation"]),
                                      tokenizer, task, num_proc=data_args.preprocessing_num_workers)
    logger.info("data from %s: %s; %s, labels %s", data_args.train_file or data_args.dataset_name,
                ", ".join(f"{len(split)} {name} examples" for name, split in tokenized.items()),
                task.problem_type, task.label_names or "none (one value per example)")
    warn_of_unknown_tokens(tokenized["train"], tokenizer)
    return ClassificationData(task, tokenized["train"], tokenized["validation"])


def load_raw_datasets(data_args: DataArguments, cache_dir: str | None = None, seed: int = 42) -> DatasetDict:
    """The "train" and "validation" splits (and "test" with --test_file), from local files or the Hub."""
    if data_args.train_file is not None:
        raw = read_files({"train": data_args.train_file, "validation": data_args.validation_file}, cache_dir)
    else:
        try:
            raw = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                        cache_dir=cache_dir)
        except Exception as err:
            raise ConfigError(f"--dataset_name {data_args.dataset_name!r} could not be loaded: {err}. "
                              "Offline? Pass local files with --train_file/--validation_file.") from None

    if "validation" not in raw:
        if "test" in raw:
            raw["validation"] = raw["test"]
        else:
            held_out = raw["train"].train_test_split(test_size=data_args.validation_split_percentage / 100,
                                                     seed=seed)
            raw["train"], raw["validation"] = held_out["train"], held_out["test"]
    raw = DatasetDict({"train": raw["train"], "validation": raw["validation"]})
    if data_args.test_file is not None:
        raw["test"] = read_files({"test": data_args.test_file}, cache_dir)["test"]

    text_flags = [("text_column", data_args.text_column), ("text_pair_column", data_args.text_pair_column)]
    for split, dataset in raw.items():
        label_flag = [] if split == "test" else [("label_column", data_args.label_column)]
        for flag, column in text_flags + label_flag:
            if column is not None and column not in dataset.column_names:
                raise ConfigError(f"--{flag} {column!r} is not a column of the {split} split; "
                                  f"columns are: {', '.join(dataset.column_names)}")
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples)):
        if limit is not None:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    return raw


def read_files(files: dict[str, str | None], cache_dir: str | None = None) -> DatasetDict:
    """Local csv/json/jsonl/parquet files by split (None: no file); the first file's suffix picks the reader.
    A missing file is named by its flag, --<split>_file."""
    files = {split: path for split, path in files.items() if path is not None}
    for split, path in files.items():
        if not Path(path).is_file():
            raise ConfigError(f"--{split}_file {path!r} not found")
    builder = FILE_BUILDERS[Path(next(iter(files.values()))).suffix]
    try:
        return datasets.load_dataset(builder, data_files=files, cache_dir=cache_dir)
    except Exception as err:  # datasets raises many types for a malformed file
        raise ConfigError(f"could not read {', '.join(files.values())} as {builder}: {err}") from None


def decide_task(raw: DatasetDict, data_args: DataArguments, model_max_length: int | None = None) -> Task:
    """The problem type (--problem_type, or what the label column holds) and the label names."""
    feature = raw["train"].features[data_args.label_column]
    problem_type = data_args.problem_type
    if problem_type == "auto":
        problem_type = ("multi_label_classification" if data_args.label_delimiter or is_list(feature)
                        else "regression" if isinstance(feature, Value) and feature.dtype.startswith("float")
                        else "single_label_classification")
        logger.info("--problem_type auto: %s, from the %s labels of --label_column %s", problem_type,
                    "split" if data_args.label_delimiter else feature, data_args.label_column)
    if problem_type == "regression":
        if not (isinstance(feature, Value) and feature.dtype.startswith(("float", "int", "uint"))):
            raise ConfigError(f"--problem_type regression needs numbers in --label_column "
                              f"{data_args.label_column}; it holds {feature}")
        names = []
    else:
        names = label_names(raw, data_args.label_column, problem_type, data_args.label_delimiter)
    max_seq_length = min(data_args.max_seq_length, model_max_length or data_args.max_seq_length)
    return Task(problem_type, names, data_args.text_column, data_args.text_pair_column, data_args.label_column,
                data_args.label_delimiter, max_seq_length, data_args.multi_label_threshold)


def is_list(feature: object) -> bool:
    return isinstance(feature, (List, LargeList))


def label_sets(values: list, delimiter: str | None) -> list[list[str]]:
    """Each example's labels, as strings: a list column, or text split on --label_delimiter."""
    if delimiter is not None:
        return [[] if value is None else [part.strip() for part in str(value).split(delimiter) if part.strip()]
                for value in values]
    return [[str(label) for label in value] if isinstance(value, list) else [str(value)] for value in values]


def label_names(raw: DatasetDict, label_column: str, problem_type: str = "single_label_classification",
                delimiter: str | None = None) -> list[str]:
    """Class names in id order: a ClassLabel's names, else the sorted distinct values of train."""
    feature = raw["train"].features[label_column]
    inner = feature.feature if is_list(feature) else feature
    if isinstance(inner, ClassLabel):
        return list(inner.names)
    if problem_type == "multi_label_classification":
        values = set(chain.from_iterable(label_sets(raw["train"][label_column], delimiter)))
        unseen = set(chain.from_iterable(label_sets(raw["validation"][label_column], delimiter))) - values
    else:
        values = set(raw["train"].unique(label_column))
        if None in values:
            raise ConfigError(f"--label_column {label_column!r} has empty values in the train split")
        unseen = set(raw["validation"].unique(label_column)) - values
    if unseen:
        raise ConfigError(f"--label_column {label_column!r}: validation has labels not seen in train: "
                          f"{sorted(map(str, unseen))}")
    if not values:
        raise ConfigError(f"--label_column {label_column!r} holds no labels in the train split")
    return [str(value) for value in sorted(values)]


def tokenize_datasets(raw: DatasetDict, tokenizer: PreTrainedTokenizerBase, task: Task,
                      num_proc: int | None = None) -> DatasetDict:
    """Tokenise (pairs as pairs), encode labels for the task, record each example's length, log the truncated.

    num_proc > 1 tokenises in that many processes, each a contiguous shard: the same rows in the same
    order and the same fingerprint as in one (datasets leaves num_proc out of it)."""
    num_proc = num_proc if num_proc is not None and num_proc > 1 else None  # datasets would fork one for 1
    feature = next(iter(raw.values())).features.get(task.label_column)
    class_ids = isinstance(feature.feature if is_list(feature) else feature, ClassLabel)  # ids already
    tokenized = DatasetDict({
        split: dataset.map(partial(encode, tokenizer=tokenizer, task=task, split=split, class_ids=class_ids),
                           batched=True, with_indices=True, num_proc=num_proc,
                           remove_columns=dataset.column_names, desc=f"Tokenizing {split}")
        for split, dataset in raw.items()
    })
    for split, dataset in tokenized.items():
        if count := sum(dataset["truncated"]):
            logger.info("%s: %d of %d inputs were longer than max_seq_length %d and were truncated",
                        split, count, len(dataset), task.max_seq_length)
    return tokenized


def encode(batch: dict, indices: list[int], tokenizer: PreTrainedTokenizerBase, task: Task, split: str,
           class_ids: bool) -> dict:
    texts = batch[task.text_column]
    pairs = batch[task.text_pair_column] if task.text_pair_column else None
    for column, values in ((task.text_column, texts), (task.text_pair_column, pairs or [])):
        for index, value in zip(indices, values, strict=False):
            if value is None or not str(value).strip():
                raise ConfigError(f"row {index} of the {split} data (0-based) has no text in column {column!r}")
    # Longest-first, the tokenizer's default: of a pair, the longer text loses tokens first.
    encoded = tokenizer(texts, pairs, truncation=True, max_length=task.max_seq_length)
    # The length-grouped samplers read this column instead of re-measuring every example.
    encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
    encoded["truncated"] = [False] * len(texts)
    at_limit = [i for i, length in enumerate(encoded["length"]) if length == task.max_seq_length]
    if at_limit:  # only these can have been cut: measure them whole
        whole = tokenizer([texts[i] for i in at_limit], [pairs[i] for i in at_limit] if pairs else None,
                          verbose=False)["input_ids"]
        for i, ids in zip(at_limit, whole, strict=True):
            encoded["truncated"][i] = len(ids) > task.max_seq_length
    if task.label_column in batch and split in ("train", "validation"):  # rows to predict need none
        encoded["labels"] = encode_labels(batch[task.label_column], task, class_ids)
    return encoded


def encode_labels(values: list, task: Task, class_ids: bool) -> list:
    """Class ids; floats for regression; multi-hot float rows for multi-label. With class_ids the
    values are a ClassLabel's ids already, else label names."""
    if task.problem_type == "regression":
        return [float(value) for value in values]
    if task.problem_type == "multi_label_classification":  # label_sets gives ids as strings
        keys = [str(i) for i in range(task.num_labels)] if class_ids else task.label_names
        return [[float(key in labels) for key in keys] for labels in label_sets(values, task.label_delimiter)]
    ids = {name: i for i, name in enumerate(task.label_names)}
    return list(values) if class_ids else [ids[str(value)] for value in values]


def warn_of_unknown_tokens(train: Dataset, tokenizer: PreTrainedTokenizerBase) -> float:
    """The share of unknown tokens in the first 1000 train examples, special ones aside (0 for a tokenizer
    without an unknown token: byte-level ones read any text), with a warning on rank 0 when most are."""
    sample = train.select(range(min(1000, len(train))))["input_ids"]
    special = set(tokenizer.all_special_ids) - {tokenizer.unk_token_id}
    tokens = [token for ids in sample for token in ids if token not in special]
    share = tokens.count(tokenizer.unk_token_id) / max(len(tokens), 1)
    if share > 0.5 and TorchrunEnv.read().is_main_process:  # the model would learn no better than chance
        logger.warning("%.0f%% of the tokens in the first %d train examples are unknown (%s) to the "
                       "tokenizer of %s: pick a --model_name_or_path whose vocabulary covers them",
                       100 * share, len(sample), tokenizer.unk_token, tokenizer.name_or_path)
    return share


COMPILE_BUCKET = 64  # --torch_compile pads to multiples of this: a few shapes, so a few compiled graphs


class ClassificationCollator(DataCollatorWithPadding):
    """Dynamic padding that keeps only what the model takes (drops helper columns such as length).
    With max_length set, a batch is padded to the next multiple of COMPILE_BUCKET, at
    most max_length."""

    def __call__(self, features: list[dict]) -> dict:
        features = [{key: value for key, value in f.items() if key in MODEL_INPUTS} for f in features]
        if self.max_length is None:
            return super().__call__(features)
        longest = max(len(f["input_ids"]) for f in features)
        bucket = min(-(-longest // COMPILE_BUCKET) * COMPILE_BUCKET, self.max_length)
        return DataCollatorWithPadding(self.tokenizer, padding="max_length", max_length=bucket)(features)


def build_collator(tokenizer: PreTrainedTokenizerBase, mixed_precision: bool,
                   compiled_length: int | None = None) -> ClassificationCollator:
    """compiled_length: --torch_compile's cap, the task's max_seq_length; None pads to the longest."""
    # Multiples of 8 let tensor cores run the padded matmuls at full speed.
    return ClassificationCollator(tokenizer, pad_to_multiple_of=8 if mixed_precision else None,
                                  max_length=compiled_length)


def length_grouped_steps(order: list[int], lengths: Sequence[int], step: int,
                         generator: torch.Generator) -> list[list[int]]:
    """--train_sampling_strategy group_by_length: an epoch's shuffled `order` in optimizer steps of `step`
    examples of similar length. Megabatches of up to 50 steps, at least 2 of them in an epoch of 2 steps or
    more (so that the examples sharing a step change from epoch to epoch), are sorted by length, cut into
    steps and their steps shuffled."""
    megabatch = step * max(1, min(50, len(order) // (step * 2)))
    steps = []
    for start in range(0, len(order), megabatch):
        group = sorted(order[start : start + megabatch], key=lengths.__getitem__, reverse=True)
        cut = [group[i : i + step] for i in range(0, len(group), step)]
        whole = len(group) // step  # a short last step stays last: moved, it would shift later batches
        steps += [cut[i] for i in torch.randperm(whole, generator=generator).tolist()] + cut[whole:]
    if steps:  # the longest full step first: an out-of-memory error shows at step 1, not hours in
        longest = max(range(len(steps)), key=lambda i: (len(steps[i]) == step, lengths[steps[i][0]]))
        steps[0], steps[longest] = steps[longest], steps[0]
    return steps
