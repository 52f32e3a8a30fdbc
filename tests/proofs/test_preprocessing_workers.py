"""--preprocessing_num_workers: tokenising in several processes gives what one process gives, in
training and in predict.

Fast and in-process, no torchrun: data generated with smoke.py, its tiny offline tokenizer and model,
datasets cached in tmp_path. A spy on datasets.Dataset.map shows the flag's value reaching the
tokenising map; the cache files (one per worker's shard) show that the work really was split.
"""

from __future__ import annotations

import json
import operator
from pathlib import Path

import datasets
import huggingface_hub.constants
import pytest
from conftest import PACKAGE, package_module
from transformers import HfArgumentParser

ConfigError, DataArguments = operator.attrgetter("ConfigError", "DataArguments")(package_module("config"))
data = package_module("data")
predict = package_module("predict")
smoke = package_module("smoke")

TRAIN_SIZE = 1200  # more than one map batch (1000 rows): one process and two cut the batches differently
MAX_SEQ_LENGTH = 32  # truncates about half of the reviews, so the truncation path runs too


@pytest.fixture(autouse=True)
def isolated_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Offline, single-process, with datasets cached in tmp_path (predict reads files into the default cache)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets_cache")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def map_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int | None]]:
    """(desc, num_proc) of every tokenising Dataset.map call; the real map still runs."""
    calls = []
    real_map = datasets.Dataset.map

    def recording_map(self, *args, **kwargs):
        if str(kwargs.get("desc", "")).startswith("Tokenizing"):
            calls.append((kwargs["desc"], kwargs.get("num_proc")))
        return real_map(self, *args, **kwargs)

    monkeypatch.setattr(datasets.Dataset, "map", recording_map)
    return calls


def write_reviews(folder: Path, empty_row: int | None = None) -> list[str]:
    """train.jsonl and validation.jsonl of smoke reviews; flags for DataArguments."""
    folder.mkdir(parents=True, exist_ok=True)
    train = smoke.synthetic_examples(TRAIN_SIZE, seed=0)
    if empty_row is not None:
        train[empty_row]["text"] = " "
    smoke.write_jsonl(folder / "train.jsonl", train)
    smoke.write_jsonl(folder / "validation.jsonl", smoke.synthetic_examples(101, seed=1))
    return ["--train_file", str(folder / "train.jsonl"), "--validation_file", str(folder / "validation.jsonl"),
            "--max_seq_length", str(MAX_SEQ_LENGTH)]


def parse_data_args(flags: list[str]):
    (data_args,) = HfArgumentParser(DataArguments).parse_args_into_dataclasses(args=flags)
    return data_args


def cache_file_names(dataset: datasets.Dataset) -> list[str]:
    return [Path(entry["filename"]).name for entry in dataset.cache_files]


def test_two_workers_tokenise_the_same_rows_in_the_same_order_with_the_same_fingerprint_as_one(
    tmp_path: Path,
) -> None:
    data_args = parse_data_args(write_reviews(tmp_path / "data"))
    raw = data.load_raw_datasets(data_args, str(tmp_path / "cache"))
    task = data.decide_task(raw, data_args)
    tokenizer = smoke.build_tokenizer()

    two = data.tokenize_datasets(raw, tokenizer, task, num_proc=2)
    fingerprint = two["train"]._fingerprint
    assert cache_file_names(two["train"]) == [f"cache-{fingerprint}_0000{rank}_of_00002.arrow" for rank in (0, 1)]
    expected = {split: (dataset.features, dataset.to_dict(), dataset._fingerprint) for split, dataset in two.items()}
    for dataset in two.values():  # a fresh cache for one process: else it would read the two workers' files
        for entry in dataset.cache_files:
            Path(entry["filename"]).unlink()

    one = data.tokenize_datasets(raw, tokenizer, task)
    assert cache_file_names(one["train"]) == [f"cache-{fingerprint}.arrow"]  # tokenised again, in this process
    assert {split: (dataset.features, dataset.to_dict(), dataset._fingerprint) for split, dataset in one.items()} \
        == expected
    assert one["train"].column_names == ["input_ids", "token_type_ids", "attention_mask", "length", "truncated",
                                         "labels"]
    assert len(one["train"]) == TRAIN_SIZE
    assert 0 < sum(one["train"]["truncated"]) < TRAIN_SIZE


@pytest.mark.parametrize(("workers", "num_proc", "shards"), [
    pytest.param(None, None, 1, id="unset-in-process"),
    pytest.param(0, None, 1, id="0-in-process"),
    pytest.param(1, None, 1, id="1-in-process"),
    pytest.param(2, 2, 2, id="2-workers"),
])
def test_the_flag_reaches_the_tokenising_map_of_both_splits_in_training(
    tmp_path: Path, map_calls: list, workers: int | None, num_proc: int | None, shards: int
) -> None:
    flags = write_reviews(tmp_path / "data")
    if workers is not None:
        flags += ["--preprocessing_num_workers", str(workers)]
    loaded = data.load_data(parse_data_args(flags), smoke.build_tokenizer(), str(tmp_path / "cache"), seed=0)
    assert map_calls == [("Tokenizing train", num_proc), ("Tokenizing validation", num_proc)]
    assert len(cache_file_names(loaded.train)) == shards
    assert (len(loaded.train), len(loaded.validation)) == (TRAIN_SIZE, 101)


def test_a_row_without_text_is_named_by_its_row_in_the_file_when_a_worker_finds_it(tmp_path: Path) -> None:
    flags = write_reviews(tmp_path / "data", empty_row=900)  # in the second worker's shard, rows 600 to 1199
    data_args = parse_data_args(flags + ["--preprocessing_num_workers", "2"])
    with pytest.raises(ConfigError, match=r"^row 900 of the train data \(0-based\) has no text in column 'text'$"):
        data.load_data(data_args, smoke.build_tokenizer(), str(tmp_path / "cache"), seed=0)


def test_a_negative_worker_count_is_refused_in_training_and_predict() -> None:
    message = r"^--preprocessing_num_workers -1: must be >= 0 \(0 or 1 tokenises in this process\)$"
    with pytest.raises(ConfigError, match=message):
        DataArguments(train_file="train.jsonl", preprocessing_num_workers=-1)
    with pytest.raises(ConfigError, match=message):
        predict.PredictArguments("model", "rows.csv", "out.csv", preprocessing_num_workers=-1)


def test_predict_with_two_workers_writes_what_it_writes_with_one(
    smoke_assets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, map_calls: list
) -> None:
    # main() would set the libraries' log levels and progress bars for the rest of the test session.
    monkeypatch.setattr(predict, "setup_logging", lambda is_main_process: None)
    flags = ["--model_name_or_path", str(smoke_assets / "tiny-bert"), "--input_file",
             str(smoke_assets / "validation.jsonl"), "--use_cpu", "true", "--batch_size", "16"]
    outputs = {}
    for name, extra in (("one", []), ("two", ["--preprocessing_num_workers", "2"])):
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / f"cache-{name}")  # each its own cache
        outputs[name] = tmp_path / f"{name}.jsonl"
        predict.main([*flags, "--output_file", str(outputs[name]), *extra])
    assert map_calls == [("Tokenizing input", None), ("Tokenizing input", 2)]
    two_cache = list((tmp_path / "cache-two").rglob("cache-*_of_00002.arrow"))
    assert len(two_cache) == 2, f"{PACKAGE}.predict did not tokenise in two processes"
    rows = [json.loads(line) for line in outputs["one"].read_text().splitlines()]
    assert len(rows) == 101 and {"prediction", "score"} <= set(rows[0])
    assert outputs["two"].read_text() == outputs["one"].read_text()
