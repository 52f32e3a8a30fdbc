"""data.py: loading local files, label names, tokenising, the collator and the steps of similar length. The
tokenizer is the tiny offline one from smoke.py; data is built in memory or written into tmp_path."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import random
from pathlib import Path

import pytest
import torch
from conftest import in_memory, names_from, package_module, task_of
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

ConfigError = names_from("config", "ConfigError")
(DataArguments, build_collator, label_names, length_grouped_steps, load_raw_datasets, tokenize_datasets,
 warn_of_unknown_tokens) = names_from(
    "data", "DataArguments", "build_collator", "label_names", "length_grouped_steps", "load_raw_datasets",
    "tokenize_datasets", "warn_of_unknown_tokens"
)
smoke = package_module("smoke")
example_rows = smoke.synthetic_examples

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


# ---- loading local files -----------------------------------------------------------------------

def write_rows(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".csv":
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))  # one JSON array
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        Dataset.from_list(rows).to_parquet(str(path))
    return path


def load(tmp_path: Path, **options) -> DatasetDict:
    return load_raw_datasets(DataArguments(**options), cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize("suffix", [".csv", ".json", ".jsonl", ".parquet"])
def test_load_raw_datasets_reads_each_local_format(tmp_path: Path, suffix: str) -> None:
    train, validation = example_rows(40, seed=1), example_rows(10, seed=2)
    raw = load(tmp_path, train_file=str(write_rows(tmp_path / f"train{suffix}", train)),
               validation_file=str(write_rows(tmp_path / f"validation{suffix}", validation)))
    assert list(raw) == ["train", "validation"]
    assert raw["train"]["text"] == [row["text"] for row in train]
    assert raw["validation"]["label"] == [row["label"] for row in validation]


def test_a_seeded_share_of_train_is_held_out_without_a_validation_file_and_max_samples_keep_the_first(
    tmp_path: Path,
) -> None:
    rows = example_rows(50, seed=1)
    train_file = str(write_rows(tmp_path / "unsplit.jsonl", rows))
    raw = load(tmp_path, train_file=train_file, validation_split_percentage=20)
    assert (len(raw["train"]), len(raw["validation"])) == (40, 10)
    held_out, kept = set(raw["validation"]["text"]), set(raw["train"]["text"])
    assert held_out.isdisjoint(kept) and held_out | kept == {row["text"] for row in rows}
    again = load(tmp_path, train_file=train_file, validation_split_percentage=20)
    assert again["validation"]["text"] == raw["validation"]["text"]  # same seed, same split on every rank
    train, validation = example_rows(30, seed=1), example_rows(12, seed=2)
    raw = load(tmp_path, train_file=str(write_rows(tmp_path / "train.jsonl", train)),
               validation_file=str(write_rows(tmp_path / "validation.jsonl", validation)),
               max_train_samples=7, max_eval_samples=5)
    assert raw["train"]["text"] == [row["text"] for row in train[:7]]
    assert raw["validation"]["text"] == [row["text"] for row in validation[:5]]
    bigger = load(tmp_path, train_file=str(tmp_path / "train.jsonl"),
                  validation_file=str(tmp_path / "validation.jsonl"), max_train_samples=1000)
    assert len(bigger["train"]) == 30


NOT_A_COLUMN = "'sentence' is not a column of the train split; columns are: text, label"


@pytest.mark.parametrize(("options", "message"), [
    (dict(text_column="sentence"), f"--text_column {NOT_A_COLUMN}"),
    (dict(label_column="sentence"), f"--label_column {NOT_A_COLUMN}"),
    (dict(validation_file="{tmp}/dev.jsonl"), "--validation_file '{tmp}/dev.jsonl' not found"),
    (dict(train_file="{tmp}/dev.jsonl"), "--train_file '{tmp}/dev.jsonl' not found"),
    (dict(train_file="{tmp}/broken.json"), "could not read {tmp}/broken.json as json"),
], ids=["text-column", "label-column", "missing-validation-file", "missing-train-file", "malformed-file"])
def test_a_missing_column_or_file_or_a_malformed_file_is_refused_by_name(
    tmp_path: Path, options: dict, message: str
) -> None:
    train_file = str(write_rows(tmp_path / "train.csv", example_rows(20, seed=1)))
    (tmp_path / "broken.json").write_text('{"text": "good film", "label": 1}\n{"text": oops\n')
    options = {name: value.format(tmp=tmp_path) for name, value in options.items()}
    with pytest.raises(ConfigError, match=message.format(tmp=tmp_path)):
        load(tmp_path, **{"train_file": train_file, **options})


# ---- labels and tokenising ---------------------------------------------------------------------

CLASS_LABELS = Features(text=Value("string"), label=ClassLabel(names=["pos", "neg", "neutral"]))


@pytest.mark.parametrize(("train", "validation", "features", "names"), [
    (["pos", "neg", "neutral", "neg"], ["neg", "pos"], None, ["neg", "neutral", "pos"]),
    ([10, 2, 0, 2], [0, 10], None, ["0", "2", "10"]),  # ints sorted as numbers, then named as strings
    ([0, 1, 1], [2], CLASS_LABELS, ["pos", "neg", "neutral"]),  # "neutral" only in validation: still a class
], ids=["strings", "ints", "class-labels"])
def test_labels_are_sorted_but_class_label_names_keep_their_order(
    train: list, validation: list, features: Features | None, names: list[str]
) -> None:
    assert label_names(in_memory(train, validation, features), "label") == names


@pytest.mark.parametrize(("train", "validation", "message"), [
    (["neg", "pos"], ["pos", "meh", "awful"], r"validation has labels not seen in train: \['awful', 'meh'\]"),
    (["neg", None], ["neg"], "has empty values in the train split"),
], ids=["unseen-in-train", "empty-in-train"])
def test_validation_labels_unseen_in_train_and_empty_train_labels_are_refused(
    train: list, validation: list, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        label_names(in_memory(train, validation), "label")


def tokenized(raw: DatasetDict, max_seq_length: int = 512) -> tuple[DatasetDict, list[str]]:
    names = label_names(raw, "label")
    return tokenize_datasets(raw, smoke.build_tokenizer(), task_of(*names, max_seq_length=max_seq_length)), names


def test_tokenize_maps_labels_to_ids_in_label_names_order() -> None:
    raw = in_memory(["pos", "neg", "neutral", "neg"], ["neutral", "pos"])
    data, names = tokenized(raw)
    assert data["train"]["labels"] == [2, 0, 1, 0]
    assert data["validation"]["labels"] == [1, 2]
    assert [names[i] for i in data["train"]["labels"]] == raw["train"]["label"]
    ints, _ = tokenized(in_memory([10, 2, 0], [2]))
    assert ints["train"]["labels"] == [2, 1, 0]
    features = Features(text=Value("string"), label=ClassLabel(names=["pos", "neg"]))
    class_labels, _ = tokenized(in_memory([1, 0, 1], [0], features=features))
    assert class_labels["train"]["labels"] == [1, 0, 1]


def test_tokenize_keeps_model_inputs_records_lengths_and_truncates() -> None:
    data, _ = tokenized(in_memory(["a", "b", "a", "b", "a"], ["a"]))
    assert sorted(data["train"].column_names) == [
        "attention_mask", "input_ids", "labels", "length", "token_type_ids", "truncated"]
    # "good" x (i % 5 + 1) plus [CLS] and [SEP].
    assert data["train"]["length"] == [3, 4, 5, 6, 7]
    assert data["train"]["length"] == [len(ids) for ids in data["train"]["input_ids"]]
    tokenizer = smoke.build_tokenizer()
    data, _ = tokenized(in_memory(["a", "b", "a", "b", "a"], ["a"]), max_seq_length=5)
    assert data["train"]["length"] == [3, 4, 5, 5, 5]
    assert [ids[-1] for ids in data["train"]["input_ids"]] == [tokenizer.sep_token_id] * 5
    assert data["train"]["truncated"] == [False, False, False, True, True]  # the 5-token one fits exactly


def test_train_data_the_tokenizer_cannot_read_is_warned_of_in_one_line_on_rank_0(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer, task = smoke.build_tokenizer(), task_of("negative", "positive")
    smoke_train, unreadable_train = (
        tokenize_datasets(DatasetDict(train=Dataset.from_list(rows)), tokenizer, task)["train"] for rows in (
            example_rows(20, seed=1),
            [{"text": "the quick brown fox jumps", "label": "negative"}] * 2,  # "the" is a smoke word, the rest not
        ))
    with caplog.at_level(logging.WARNING):
        assert warn_of_unknown_tokens(smoke_train, tokenizer) == 0
        assert caplog.records == []
        assert warn_of_unknown_tokens(unreadable_train, tokenizer) == 0.8  # [CLS] and [SEP] aside
        monkeypatch.setenv("RANK", "1")
        assert warn_of_unknown_tokens(unreadable_train, tokenizer) == 0.8
    assert [record.getMessage() for record in caplog.records] == [
        "80% of the tokens in the first 2 train examples are unknown ([UNK]) to the tokenizer of "
        f"{tokenizer.name_or_path}: pick a --model_name_or_path whose vocabulary covers them"
    ]


# ---- collator ----------------------------------------------------------------------------------

def features_of_lengths(*lengths: int) -> list[dict]:
    return [
        dict(input_ids=[2, *range(5, 5 + n - 2), 3], attention_mask=[1] * n, token_type_ids=[0] * n,
             labels=i % 2, length=n, sample_index=i)
        for i, n in enumerate(lengths)
    ]


def test_collator_drops_helper_columns_and_pads_to_the_longest_or_a_multiple_of_8_or_of_64_compiled() -> None:
    tokenizer = smoke.build_tokenizer()
    batch = build_collator(tokenizer, mixed_precision=False)(features_of_lengths(4, 10, 6))
    assert sorted(batch) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
    assert batch["input_ids"].shape == (3, 10)
    assert batch["attention_mask"].sum(dim=1).tolist() == [4, 10, 6]
    assert batch["input_ids"][0, 4:].tolist() == [tokenizer.pad_token_id] * 6
    assert batch["labels"].tolist() == [0, 1, 0]
    short = build_collator(tokenizer, mixed_precision=False)(features_of_lengths(4, 5))
    assert short["input_ids"].shape == (2, 5)  # dynamic: this batch's longest, not max_seq_length
    assert build_collator(tokenizer, mixed_precision=True)(features_of_lengths(4, 10))["input_ids"].shape == (2, 16)
    assert build_collator(tokenizer, mixed_precision=True)(features_of_lengths(4, 16))["input_ids"].shape == (2, 16)
    bounded = build_collator(tokenizer, mixed_precision=True, compiled_length=150)  # --torch_compile's: 64s, <= 150
    assert [bounded(features_of_lengths(4, n))["input_ids"].shape[1] for n in (10, 64, 65, 140)] == [64, 64, 128, 150]


# ---- steps of similar length (--train_sampling_strategy group_by_length, both loops) --------------

def grouped(lengths: list[int], step: int, epoch: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(epoch)
    return length_grouped_steps(torch.randperm(len(lengths), generator=generator).tolist(), lengths, step, generator)


def test_steps_pad_little_are_sorted_shuffled_regrouped_every_epoch_and_the_longest_first() -> None:
    rng = random.Random(0)
    lengths = [min(120, max(6, int(rng.lognormvariate(3.0, 0.7)))) for _ in range(256)]  # long-tailed, as reviews
    steps = grouped(lengths, 8)  # 32 steps of 8 on 2 ranks of 4: 2 megabatches (at least 4 padded 7% more)
    assert sorted(i for step in steps for i in step) == list(range(256))
    padded = sum(4 * max(lengths[i] for i in step[half:half + 4]) for step in steps for half in (0, 4))
    least = sum(4 * sorted(lengths)[i + 3] for i in range(0, 256, 4))  # batches of 4 in length order
    assert padded <= 1.04 * least
    lengths = random.Random(0).sample(range(6, 600), 256)  # no ties; 32 steps of 8: 2 megabatches of 16
    steps = grouped(lengths, 8)
    assert all([lengths[i] for i in step] == sorted((lengths[i] for i in step), reverse=True) for step in steps)
    longest = [lengths[step[0]] for step in steps]
    assert longest[0] == max(lengths)  # an out-of-memory error shows at step 1
    # Not longest to shortest through each megabatch: there, about half the steps are longer than the one before.
    assert sum(later > earlier for earlier, later in itertools.pairwise(longest)) > len(longest) // 4
    # At least 2 megabatches: the examples that share a step change from epoch to epoch.
    first, second = ({tuple(sorted(step)) for step in grouped(lengths, 8, epoch)} for epoch in (0, 1))
    assert len(first & second) < len(first) // 2
    assert [len(step) for step in grouped(list(range(1, 38)), 8)] == [8, 8, 8, 8, 5]  # short last step last
