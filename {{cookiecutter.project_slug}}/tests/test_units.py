"""Fast in-process tests of the modules both loops share: no torchrun, no network, a few seconds in all.

Sections follow the modules: distributed, config, data (loading, labels, tokenising, collator),
metrics, modeling, smoke. Config files are parsed with the rendered loop's own TrainingArguments
(every project has training_args.py), so each test here holds for either loop. The model and
tokenizer are the tiny offline ones from smoke.py; data files are written into tmp_path.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import operator
from pathlib import Path

import huggingface_hub.constants
import numpy as np
import pytest
import torch
import yaml
from accelerate.state import AcceleratorState
from conftest import EVAL_SIZE, PACKAGE, REPO_ROOT, TRAIN_SIZE, package_module
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification


def names_from(module: str, *names: str) -> tuple:
    """`from <package>.<module> import <names>`, for a package whose name conftest finds at run time."""
    return operator.attrgetter(*names)(package_module(module))


ConfigError, DataArguments, ModelArguments = names_from("config", "ConfigError", "DataArguments", "ModelArguments")
build_collator, label_names, load_raw_datasets, tokenize_datasets = names_from(
    "data", "build_collator", "label_names", "load_raw_datasets", "tokenize_datasets"
)
distributed = package_module("distributed")
resolve_device_settings = distributed.resolve_device_settings
classification_metrics, write_metrics = names_from("metrics", "classification_metrics", "write_metrics")
load_model, load_tokenizer = names_from("modeling", "load_model", "load_tokenizer")
smoke = package_module("smoke")
TrainingArguments = package_module("training_args").TrainingArguments  # the rendered loop's own


@pytest.fixture(autouse=True)
def isolated_process(monkeypatch: pytest.MonkeyPatch):
    """Offline, single-process, and no accelerate state left behind for the next test or module.

    huggingface_hub reads HF_HUB_OFFLINE once, at import, so the constant itself is patched: a
    missing model path then fails at once instead of retrying the Hub for ~20 s.

    In a Trainer project, parsing builds transformers' TrainingArguments, whose device setup fills
    accelerate's process-wide PartialState. The tests here cannot leak into each other through it
    (transformers resets that state before every device setup), but the state would outlive this
    module, so it is reset after each test.
    """
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def parse_args(argv: list[str]) -> tuple:
    """(model, data, training) arguments, parsed as this project's train.py parses them."""
    return package_module("config").parse_args(TrainingArguments, argv)


# ---- distributed: device, backend and precision ------------------------------------------------

# (mixed_precision, cuda available, bf16 supported) -> precision, or None where it is refused.
PRECISION_TABLE = [
    ("auto", False, False, "no"),
    ("auto", False, True, "no"),
    ("auto", True, False, "fp16"),
    ("auto", True, True, "bf16"),
    ("bf16", False, False, "bf16"),  # bf16 autocast works on CPU
    ("bf16", False, True, "bf16"),
    ("bf16", True, False, None),  # V100, T4: emulated, slowly
    ("bf16", True, True, "bf16"),
    ("fp16", False, False, None),
    ("fp16", False, True, None),
    ("fp16", True, False, "fp16"),
    ("fp16", True, True, "fp16"),
    ("no", False, False, "no"),
    ("no", False, True, "no"),
    ("no", True, False, "no"),
    ("no", True, True, "no"),
]


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize(("mixed_precision", "cuda", "bf16_ok", "expected"), PRECISION_TABLE)
def test_resolve_device_settings_picks_precision_device_and_backend(
    monkeypatch: pytest.MonkeyPatch, world_size: int, mixed_precision: str, cuda: bool, bf16_ok: bool,
    expected: str | None,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    if expected is None:
        with pytest.raises(ConfigError, match="--mixed_precision"):
            resolve_device_settings(mixed_precision, cuda_available=cuda, bf16_supported=bf16_ok)
        return
    settings = resolve_device_settings(mixed_precision, cuda_available=cuda, bf16_supported=bf16_ok)
    assert settings.precision == expected
    assert settings.use_cpu is (not cuda)
    assert settings.ddp_backend == (None if world_size == 1 else "nccl" if cuda else "gloo")


def test_bf16_on_a_gpu_that_only_emulates_it_is_refused_naming_the_alternatives() -> None:
    with pytest.raises(ConfigError, match=r"^--mixed_precision bf16: this GPU has no native bf16 .* use "
                                         r"--mixed_precision fp16 or auto$"):
        resolve_device_settings("auto", bf16=True, cuda_available=True, bf16_supported=False)


def test_bf16_support_is_read_from_this_ranks_gpu_without_emulation_or_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or (7, 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: pytest.fail("a query must not pin a GPU"))
    resolve_device_settings("bf16", cuda_available=False)
    assert asked == []
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device_settings("auto", cuda_available=True).precision == "fp16"  # 7.0: bf16 only emulated
    assert asked == [3]


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch):
    """Pretend `count` GPUs are visible; returns the devices pinned with torch.cuda.set_device."""
    pinned = []

    def fake(count: int) -> list:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", pinned.append)
        return pinned
    return fake


def test_several_gpus_in_one_process_without_torchrun_are_refused(gpus) -> None:
    pinned = gpus(2)
    with pytest.raises(ConfigError, match=r"^2 GPUs are visible to one process: start one process per GPU with "
                                          r"scripts/train_single_node.sh \(torchrun\), or set CUDA_VISIBLE_DEVICES=0$"):
        distributed.select_device(use_cpu=False)
    assert pinned == []


def test_predict_alone_with_several_gpus_takes_the_first_and_says_so(gpus, caplog) -> None:
    pinned = gpus(8)
    with caplog.at_level(logging.INFO):
        assert distributed.select_device(use_cpu=False, several_gpus="first") == torch.device("cuda", 0)
    assert pinned == [0]
    assert "8 GPUs are visible to this one process: it uses cuda:0 alone" in caplog.text


def test_each_torchrun_rank_pins_its_local_gpu(gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = gpus(4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert distributed.select_device(use_cpu=False) == torch.device("cuda", 3)
    assert pinned == [3]


def test_one_gpu_or_use_cpu_needs_no_torchrun(gpus) -> None:
    pinned = gpus(1)
    assert distributed.select_device(use_cpu=False) == torch.device("cuda", 0)
    gpus(8)
    assert distributed.select_device(use_cpu=True) == torch.device("cpu")
    assert pinned == [0]


def test_rank_zero_prepares_data_before_every_other_rank_even_on_other_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Global, not per node: nodes sharing an HF cache would otherwise write the same files at once."""
    events = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "barrier", lambda: events.append("barrier"))
    for rank, local_rank in (("0", "0"), ("2", "0")):  # rank 2 is the first rank of the second node
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        with distributed.main_process_first():
            events.append(f"rank {rank} works")
    assert events == ["rank 0 works", "barrier", "barrier", "rank 2 works"]


def test_fp16_on_cpu_is_refused_with_a_message_naming_mixed_precision() -> None:
    with pytest.raises(ConfigError, match=r"--mixed_precision fp16 needs a CUDA GPU.*--mixed_precision no"):
        resolve_device_settings("auto", fp16=True, cuda_available=False)
    # --use_cpu on a GPU machine is CPU too.
    with pytest.raises(ConfigError, match="--mixed_precision fp16 needs a CUDA GPU"):
        resolve_device_settings("fp16", use_cpu=True, cuda_available=True, bf16_supported=True)


def test_use_cpu_wins_over_an_available_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = resolve_device_settings("auto", use_cpu=True, cuda_available=True, bf16_supported=True)
    assert (settings.use_cpu, settings.ddp_backend, settings.precision) == (True, "gloo", "no")


def test_fp16_and_bf16_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="--fp16 and --bf16 are both set"):
        resolve_device_settings("auto", fp16=True, bf16=True, cuda_available=True, bf16_supported=True)


@pytest.mark.parametrize(("mixed_precision", "flags"), [("bf16", "fp16"), ("no", "fp16"), ("fp16", "bf16")])
def test_explicit_precision_flag_contradicting_mixed_precision_is_refused(mixed_precision: str, flags: str) -> None:
    with pytest.raises(ConfigError, match=f"--{flags} contradicts --mixed_precision {mixed_precision}"):
        resolve_device_settings(
            mixed_precision, fp16=flags == "fp16", bf16=flags == "bf16", cuda_available=True, bf16_supported=True
        )


def test_explicit_precision_flag_wins_over_auto_and_agrees_with_its_own_name() -> None:
    # auto would pick bf16 here; --fp16 given directly overrides it.
    assert resolve_device_settings("auto", fp16=True, cuda_available=True, bf16_supported=True).precision == "fp16"
    assert resolve_device_settings("fp16", fp16=True, cuda_available=True, bf16_supported=True).precision == "fp16"
    assert resolve_device_settings("auto", bf16=True, cuda_available=False).precision == "bf16"


def test_unknown_mixed_precision_is_refused() -> None:
    with pytest.raises(ConfigError, match="--mixed_precision 'fp32': use auto, bf16, fp16 or no"):
        resolve_device_settings("fp32", cuda_available=False)


def test_explicit_ddp_backend_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_device_settings("auto", ddp_backend="gloo", cuda_available=True, bf16_supported=True).ddp_backend \
        == "gloo"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert resolve_device_settings("no", ddp_backend="nccl", cuda_available=True).ddp_backend == "nccl"


@pytest.mark.parametrize("cpus, local_world_size, expected", [(2, "2", 0), (2, "1", 1), (16, "8", 1), (64, "8", 4),
                                                          (96, "1", 4)])
def test_loader_workers_default_to_this_process_share_of_the_cpus(
    monkeypatch: pytest.MonkeyPatch, cpus: int, local_world_size: str, expected: int
) -> None:
    monkeypatch.setattr(distributed.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    assert distributed.default_dataloader_workers() == expected


def test_loader_workers_follow_the_machine_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    parse_args = package_module("config").parse_args
    training_args = package_module("training_args").TrainingArguments
    data = ["--model_name_or_path", "m", "--train_file", "t.csv", "--output_dir", "out", "--use_cpu", "true"]
    assert parse_args(training_args, data)[2].dataloader_num_workers == 2
    assert parse_args(training_args, [*data, "--dataloader_num_workers", "0"])[2].dataloader_num_workers == 0


# ---- config: YAML/JSON then flags ---------------------------------------------------------------

REQUIRED = ["--model_name_or_path", "some/model", "--train_file", "train.jsonl"]


def write_yaml(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_yaml_sets_values_and_flags_after_it_override_them(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "run.yaml", (
        "model_name_or_path: from/yaml\ntrain_file: data/train.csv\nlearning_rate: 0.001\n"
        "seed: 7\nmax_seq_length: 64\nnum_train_epochs: 3\n"
    ))
    model_args, data_args, training_args = parse_args([config, "--learning_rate", "0.005", "--seed", "9"])
    assert training_args.learning_rate == 0.005  # flag
    assert training_args.seed == 9  # flag
    assert training_args.num_train_epochs == 3  # yaml
    assert data_args.max_seq_length == 64  # yaml
    assert (model_args.model_name_or_path, data_args.train_file) == ("from/yaml", "data/train.csv")
    _, _, from_yaml_only = parse_args([config])
    assert from_yaml_only.learning_rate == 0.001


def test_json_config_is_read_like_yaml(tmp_path: Path) -> None:
    config = tmp_path / "run.json"
    config.write_text(json.dumps(
        dict(model_name_or_path="from/json", train_file="t.parquet", learning_rate=0.002, max_seq_length=32)
    ))
    model_args, data_args, training_args = parse_args([str(config), "--max_seq_length", "16"])
    assert (model_args.model_name_or_path, data_args.train_file) == ("from/json", "t.parquet")
    assert training_args.learning_rate == 0.002
    assert data_args.max_seq_length == 16


def test_yaml_exponent_without_a_dot_still_becomes_a_float(tmp_path: Path) -> None:
    """PyYAML reads `2e-5` as the string '2e-5' (YAML 1.1); argparse converts string defaults by type."""
    config = write_yaml(tmp_path / "run.yaml", "model_name_or_path: m\ntrain_file: t.jsonl\nlearning_rate: 2e-5\n")
    _, _, training_args = parse_args([config])
    assert training_args.learning_rate == pytest.approx(2e-5)
    assert isinstance(training_args.learning_rate, float)


def test_unknown_yaml_key_is_refused_by_name(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "run.yaml", "model_name_or_path: m\ntrain_file: t.jsonl\nlearning_rat: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) learning_rat;"):
        parse_args([config])


def test_unknown_flag_is_refused_with_argparse_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refusal:
        parse_args([*REQUIRED, "--lerning_rate", "0.1"])
    assert refusal.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith("usage: ")
    assert "error: unrecognized arguments: --lerning_rate 0.1" in stderr


def test_missing_config_file_is_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=f"config file '{missing}' not found"):
        parse_args([missing])


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "list.yaml", "- learning_rate\n- 0.1\n")
    with pytest.raises(ConfigError, match="must hold a mapping of flag names to values"):
        parse_args([config])


def test_invalid_yaml_is_refused(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "broken.yaml", "learning_rate: [0.1,\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        parse_args([config])


@pytest.mark.parametrize("config", ["smoke.yaml", "default.yaml", "local_files.yaml", "smoke_pairs.yaml",
                                    "smoke_regression.yaml", "smoke_multilabel.yaml"])
def test_shipped_configs_parse_and_every_value_lands(config: str) -> None:
    path = REPO_ROOT / "configs" / config
    # default.yaml holds the generated mixed_precision answer; fp16 is refused on a CPU-only machine.
    parsed = {}
    for arguments in parse_args([str(path), "--mixed_precision", "no"]):
        parsed.update(vars(arguments))
    values = yaml.safe_load(path.read_text())
    values.pop("mixed_precision")
    assert {key: parsed[key] for key in values} == values


def test_defaults_suit_ddp_fine_tuning() -> None:
    _, data_args, training_args = parse_args(REQUIRED)
    assert training_args.train_sampling_strategy == "group_by_length"
    assert training_args.ddp_find_unused_parameters is False
    assert (training_args.output_dir, training_args.save_total_limit, training_args.logging_steps) == ("outputs", 2, 10)
    assert (training_args.do_train, training_args.do_eval) == (True, True)
    default_precision = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "mixed_precision")
    assert default_precision == "auto"
    assert (data_args.max_seq_length, data_args.validation_split_percentage) == (512, 5)


def test_nothing_to_do_is_refused() -> None:
    with pytest.raises(ConfigError, match="--do_train false and --do_eval false leave nothing to do"):
        parse_args([*REQUIRED, "--do_train", "false", "--do_eval", "false"])


@pytest.mark.parametrize(("flags", "message"), [
    (["--model_name_or_path", "m"], "--dataset_name or --train_file is required"),
    ([*REQUIRED[:2], "--train_file", "train.txt"], "--train_file 'train.txt': unsupported format"),
    ([*REQUIRED, "--validation_file", "dev.tsv"], "--validation_file 'dev.tsv': unsupported format"),
    ([*REQUIRED, "--max_seq_length", "0"], "--max_seq_length 0: must be >= 1"),
    ([*REQUIRED, "--validation_split_percentage", "100"], "--validation_split_percentage must be between 1 and 99"),
    ([*REQUIRED, "--dataset_name", "imdb"],
     r"^--dataset_name imdb and --train_file train.jsonl are both set; pass one \(configs/local_files.yaml has no "),
    (["--model_name_or_path", "m", "--dataset_name", "imdb", "--validation_file", "dev.csv"],
     "^--validation_file dev.csv needs --train_file; pass both"),
], ids=["no-data", "train-suffix", "validation-suffix", "max-seq-length-0", "split-100", "hub-and-file",
        "validation-without-train"])
def test_data_arguments_refuse_bad_settings(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(flags)


def test_default_config_with_a_train_file_is_refused_naming_local_files_yaml() -> None:
    # default.yaml names the generated dataset_name; a file on top of it must not silently win.
    default = str(REPO_ROOT / "configs" / "default.yaml")
    with pytest.raises(ConfigError, match=r"--train_file my\.csv are both set; pass one \(configs/local_files\.yaml"):
        parse_args([default, "--train_file", "my.csv", "--mixed_precision", "no"])
    local_files = str(REPO_ROOT / "configs" / "local_files.yaml")
    _, data_args, _ = parse_args([local_files, "--train_file", "my.csv", "--mixed_precision", "no"])
    assert (data_args.dataset_name, data_args.train_file, data_args.validation_file) == (None, "my.csv", "data/dev.csv")


def test_config_file_value_outside_a_flags_choices_is_refused(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "run.yaml", (
        "model_name_or_path: m\ntrain_file: t.jsonl\ntrain_sampling_strategy: group_by_lenght\n"
    ))
    with pytest.raises(ConfigError, match="train_sampling_strategy"):
        parse_args([config])


# ---- data: loading local files -----------------------------------------------------------------

def example_rows(count: int, seed: int) -> list[dict]:
    return smoke.synthetic_examples(count, seed)


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


def test_without_a_validation_file_a_seeded_share_of_train_is_held_out(tmp_path: Path) -> None:
    rows = example_rows(50, seed=1)
    train_file = str(write_rows(tmp_path / "train.jsonl", rows))
    raw = load(tmp_path, train_file=train_file, validation_split_percentage=20)
    assert (len(raw["train"]), len(raw["validation"])) == (40, 10)
    held_out, kept = set(raw["validation"]["text"]), set(raw["train"]["text"])
    assert held_out.isdisjoint(kept) and held_out | kept == {row["text"] for row in rows}
    again = load(tmp_path, train_file=train_file, validation_split_percentage=20)
    assert again["validation"]["text"] == raw["validation"]["text"]  # same seed, same split on every rank


@pytest.mark.parametrize(("option", "flag"), [("text_column", "--text_column"), ("label_column", "--label_column")])
def test_missing_column_is_refused_naming_the_flag_and_the_columns(tmp_path: Path, option: str, flag: str) -> None:
    train_file = str(write_rows(tmp_path / "train.csv", example_rows(20, seed=1)))
    with pytest.raises(ConfigError, match=f"{flag} 'sentence' is not a column of the train split; "
                                          "columns are: text, label"):
        load(tmp_path, train_file=train_file, **{option: "sentence"})


def test_missing_file_is_refused_by_name(tmp_path: Path) -> None:
    train_file = str(write_rows(tmp_path / "train.jsonl", example_rows(10, seed=1)))
    missing = str(tmp_path / "dev.jsonl")
    with pytest.raises(ConfigError, match=f"--validation_file '{missing}' not found"):
        load(tmp_path, train_file=train_file, validation_file=missing)
    with pytest.raises(ConfigError, match=f"--train_file '{missing}' not found"):
        load(tmp_path, train_file=missing)


def test_malformed_file_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "train.json"
    broken.write_text('{"text": "good film", "label": 1}\n{"text": oops\n')
    with pytest.raises(ConfigError, match=f"could not read {broken} as json"):
        load(tmp_path, train_file=str(broken))


def test_max_train_and_eval_samples_keep_the_first_examples(tmp_path: Path) -> None:
    train, validation = example_rows(30, seed=1), example_rows(12, seed=2)
    raw = load(tmp_path, train_file=str(write_rows(tmp_path / "train.jsonl", train)),
               validation_file=str(write_rows(tmp_path / "validation.jsonl", validation)),
               max_train_samples=7, max_eval_samples=5)
    assert raw["train"]["text"] == [row["text"] for row in train[:7]]
    assert raw["validation"]["text"] == [row["text"] for row in validation[:5]]
    bigger = load(tmp_path, train_file=str(tmp_path / "train.jsonl"),
                  validation_file=str(tmp_path / "validation.jsonl"), max_train_samples=1000)
    assert len(bigger["train"]) == 30


# ---- data: labels and tokenising ---------------------------------------------------------------

def in_memory(train_labels: list, validation_labels: list, features: Features | None = None) -> DatasetDict:
    def split(labels: list) -> Dataset:
        texts = [" ".join(["good"] * (i % 5 + 1)) for i in range(len(labels))]
        return Dataset.from_dict(dict(text=texts, label=labels), features=features)
    return DatasetDict(train=split(train_labels), validation=split(validation_labels))


def test_string_labels_are_sorted() -> None:
    raw = in_memory(["pos", "neg", "neutral", "neg"], ["neg", "pos"])
    assert label_names(raw, "label") == ["neg", "neutral", "pos"]


def test_int_labels_are_sorted_as_numbers_then_named_as_strings() -> None:
    raw = in_memory([10, 2, 0, 2], [0, 10])
    assert label_names(raw, "label") == ["0", "2", "10"]


def test_class_label_names_keep_their_order() -> None:
    features = Features(text=Value("string"), label=ClassLabel(names=["pos", "neg", "neutral"]))
    raw = in_memory([0, 1, 1], [2], features=features)  # "neutral" only in validation: still a class
    assert label_names(raw, "label") == ["pos", "neg", "neutral"]


def test_validation_labels_unseen_in_train_are_refused() -> None:
    raw = in_memory(["neg", "pos"], ["pos", "meh", "awful"])
    with pytest.raises(ConfigError, match=r"validation has labels not seen in train: \['awful', 'meh'\]"):
        label_names(raw, "label")


def test_empty_train_labels_are_refused() -> None:
    raw = in_memory(["neg", None], ["neg"])
    with pytest.raises(ConfigError, match="has empty values in the train split"):
        label_names(raw, "label")


def task_of(*names: str, **inputs) -> object:
    """A single-label Task over these label names (data.Task)."""
    return package_module("data").Task("single_label_classification", list(names), **inputs)


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


def test_tokenize_keeps_only_model_inputs_and_records_each_length() -> None:
    data, _ = tokenized(in_memory(["a", "b", "a", "b", "a"], ["a"]))
    assert sorted(data["train"].column_names) == [
        "attention_mask", "input_ids", "labels", "length", "token_type_ids", "truncated"]
    # "good" x (i % 5 + 1) plus [CLS] and [SEP].
    assert data["train"]["length"] == [3, 4, 5, 6, 7]
    assert data["train"]["length"] == [len(ids) for ids in data["train"]["input_ids"]]


def test_tokenize_truncates_at_max_seq_length() -> None:
    tokenizer = smoke.build_tokenizer()
    data, _ = tokenized(in_memory(["a", "b", "a", "b", "a"], ["a"]), max_seq_length=5)
    assert data["train"]["length"] == [3, 4, 5, 5, 5]
    assert [ids[-1] for ids in data["train"]["input_ids"]] == [tokenizer.sep_token_id] * 5
    assert data["train"]["truncated"] == [False, False, False, True, True]  # the 5-token one fits exactly


# ---- data: collator ----------------------------------------------------------------------------

def features_of_lengths(*lengths: int) -> list[dict]:
    return [
        dict(input_ids=[2, *range(5, 5 + n - 2), 3], attention_mask=[1] * n, token_type_ids=[0] * n,
             labels=i % 2, length=n, sample_index=i)
        for i, n in enumerate(lengths)
    ]


def test_collator_drops_helper_columns_and_pads_to_the_longest_in_the_batch() -> None:
    tokenizer = smoke.build_tokenizer()
    batch = build_collator(tokenizer, mixed_precision=False)(features_of_lengths(4, 10, 6))
    assert sorted(batch) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
    assert batch["input_ids"].shape == (3, 10)
    assert batch["attention_mask"].sum(dim=1).tolist() == [4, 10, 6]
    assert batch["input_ids"][0, 4:].tolist() == [tokenizer.pad_token_id] * 6
    assert batch["labels"].tolist() == [0, 1, 0]
    short = build_collator(tokenizer, mixed_precision=False)(features_of_lengths(4, 5))
    assert short["input_ids"].shape == (2, 5)  # dynamic: this batch's longest, not max_seq_length


def test_collator_pads_to_a_multiple_of_8_only_under_mixed_precision() -> None:
    tokenizer = smoke.build_tokenizer()
    assert build_collator(tokenizer, mixed_precision=True)(features_of_lengths(4, 10))["input_ids"].shape == (2, 16)
    assert build_collator(tokenizer, mixed_precision=True)(features_of_lengths(4, 16))["input_ids"].shape == (2, 16)
    assert build_collator(tokenizer, mixed_precision=False)(features_of_lengths(4, 10))["input_ids"].shape == (2, 10)


# ---- metrics -----------------------------------------------------------------------------------

def test_metrics_match_a_hand_computed_example() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2])
    predictions = np.array([0, 1, 1, 1, 0, 0])  # class 2 never predicted; class 3 absent from both
    metrics = classification_metrics(predictions, labels, ["a", "b", "c", "d"])
    # accuracy 3/6. F1 = 2 TP / (predicted + actual): class 0 2/5, class 1 4/5, class 2 0/2;
    # class 3 appears nowhere and does not count, so macro-F1 = (0.4 + 0.8 + 0) / 3.
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["f1_macro"] == pytest.approx(0.4)
    assert metrics["num_examples"] == 6
    # Rows are true labels, columns predictions.
    assert metrics["confusion_matrix"] == [[1, 1, 0, 0], [0, 2, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]]
    assert metrics["per_class"]["a"] == {"precision": pytest.approx(1 / 3), "recall": 0.5, "f1": pytest.approx(0.4),
                                         "support": 2}
    assert metrics["per_class"]["b"] == {"precision": pytest.approx(2 / 3), "recall": 1.0, "f1": pytest.approx(0.8),
                                         "support": 2}
    assert metrics["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert json.loads(json.dumps(metrics)) == metrics  # plain types: metrics.json takes them as they are


def test_metrics_flatten_their_inputs_and_handle_no_examples() -> None:
    names = ["no", "yes"]
    assert classification_metrics(np.array([[1], [0]]), np.array([[1], [1]]), names)["accuracy"] == pytest.approx(0.5)
    empty = classification_metrics(np.array([], dtype=int), np.array([], dtype=int), names)
    assert (empty["accuracy"], empty["f1_macro"], empty["num_examples"]) == (0.0, 0.0, 0)
    assert empty["confusion_matrix"] == [[0, 0], [0, 0]]


def test_training_curves_plot_loss_learning_rate_and_eval_metrics(tmp_path: Path) -> None:
    history = [{"step": 1, "loss": 0.7, "learning_rate": 1e-3, "grad_norm": 1.0},
               {"step": 2, "loss": 0.5, "learning_rate": 5e-4},
               {"step": 2, "eval_accuracy": 0.8, "eval_loss": 0.4, "eval_runtime": 1.0, "eval_per_class": {}}]
    path = tmp_path / "training_curves.png"
    series = package_module("metrics").plot_training_curves(history, path)
    assert series == ["eval_accuracy", "eval_loss", "learning_rate", "loss"]
    assert path.read_bytes().startswith(b"\x89PNG")


def test_write_metrics_writes_sorted_json(tmp_path: Path) -> None:
    path = write_metrics(str(tmp_path / "new" / "dir"), dict(f1_macro=0.4, accuracy=0.5, num_examples=6), trained=True)
    assert path == tmp_path / "new" / "dir" / "metrics.json"
    text = path.read_text()
    assert text.endswith("\n")
    assert list(json.loads(text)) == ["accuracy", "f1_macro", "num_examples"]
    assert json.loads(text)["num_examples"] == 6


def test_an_evaluation_alone_replaces_eval_figures_and_keeps_the_train_figures(tmp_path: Path) -> None:
    first = {"train_loss": 0.3, "epoch": 2.0, "eval_accuracy": 0.9, "eval_loss": 0.2}
    write_metrics(str(tmp_path), first, trained=True)
    write_metrics(str(tmp_path), {"eval_accuracy": 0.95, "eval_num_examples": 50, "epoch": 0.0}, trained=False)
    assert json.loads((tmp_path / "metrics.json").read_text()) == {
        "train_loss": 0.3, "epoch": 2.0, "eval_accuracy": 0.95, "eval_num_examples": 50}
    write_metrics(str(tmp_path), {"train_loss": 0.1}, trained=True)  # a new training run writes it whole
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"train_loss": 0.1}


def test_a_run_is_finished_when_no_step_is_left_and_its_metrics_are_written(tmp_path: Path) -> None:
    is_finished = package_module("metrics").is_finished
    assert not is_finished(str(tmp_path), 0)  # trained to the end, but metrics.json was never written
    (tmp_path / "metrics.json").write_text("{}\n")
    assert is_finished(str(tmp_path), 0)
    assert not is_finished(str(tmp_path), 3)  # e.g. run again with more epochs


def test_whole_run_metrics_weigh_each_logged_loss_by_the_steps_it_covers() -> None:
    metrics = package_module("metrics")
    history = [{"step": 2, "loss": 1.0}, {"step": 2, "eval_loss": 9.0}, {"step": 3, "loss": 0.4},
               {"step": 7, "loss": 0.1}]  # windows of 2, 1 and 4 steps, e.g. over a resume at step 3
    totals = metrics.add_run_totals(metrics.add_run_totals(None, 2.0, 48), 2.0, 64)
    assert totals == {"train_runtime": 4.0, "train_samples": 112}
    result = metrics.whole_run_metrics(history, totals, steps=7)
    assert result["train_loss"] == pytest.approx((2 * 1.0 + 1 * 0.4 + 4 * 0.1) / 7)
    assert (result["train_steps"], result["train_runtime"]) == (7, 4.0)
    assert (result["train_samples_per_second"], result["train_steps_per_second"]) == (28.0, 1.75)


# ---- modeling ----------------------------------------------------------------------------------

def test_load_model_names_the_labels_and_keeps_a_head_of_the_same_size(smoke_assets: Path) -> None:
    folder = smoke_assets / "tiny-bert"
    model = load_model(ModelArguments(model_name_or_path=str(folder)), task_of("negative", "positive"))
    assert model.config.num_labels == 2
    assert model.config.id2label == dict(enumerate(["negative", "positive"]))
    assert model.config.label2id == dict(negative=0, positive=1)
    saved = load_file(folder / "model.safetensors")
    assert torch.equal(model.classifier.weight, saved["classifier.weight"])


def test_checkpoint_with_another_label_count_is_refused_unless_asked_for_a_fresh_head(smoke_assets: Path) -> None:
    folder = smoke_assets / "tiny-bert"
    with pytest.raises(ConfigError, match="--ignore_mismatched_sizes true"):
        load_model(ModelArguments(model_name_or_path=str(folder)), task_of("a", "b", "c"))
    fresh_head = ModelArguments(model_name_or_path=str(folder), ignore_mismatched_sizes=True)
    model = load_model(fresh_head, task_of("a", "b", "c"))
    assert model.classifier.out_features == 3
    assert model.classifier.weight.shape == (3, 64)
    assert model.config.id2label == dict(enumerate(["a", "b", "c"]))
    saved = load_file(folder / "model.safetensors")
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, saved["bert.embeddings.word_embeddings.weight"])


def test_load_model_gives_fp32_weights_even_from_a_half_precision_checkpoint(
    smoke_assets: Path, tmp_path: Path
) -> None:
    """Weights train in fp32 (mixed precision is autocast's job): AdamW on fp16 weights loses small updates."""
    half = tmp_path / "tiny-bert-fp16"
    AutoModelForSequenceClassification.from_pretrained(smoke_assets / "tiny-bert").half().save_pretrained(half)
    assert {tensor.dtype for tensor in load_file(half / "model.safetensors").values()} == {torch.float16}
    model = load_model(ModelArguments(model_name_or_path=str(half)), task_of("negative", "positive"))
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}


def test_load_tokenizer_from_the_folder_or_tokenizer_name(smoke_assets: Path, tmp_path: Path) -> None:
    folder = str(smoke_assets / "tiny-bert")
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=folder))
    reference = smoke.build_tokenizer()
    assert len(tokenizer) == len(reference)
    assert tokenizer("good movie")["input_ids"] == reference("good movie")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(tokenizer("good movie")["input_ids"]) == ["[CLS]", "good", "movie", "[SEP]"]
    assert tokenizer.model_max_length == 128
    elsewhere = load_tokenizer(ModelArguments(model_name_or_path=str(tmp_path / "missing"), tokenizer_name=folder))
    assert len(elsewhere) == len(reference)


@pytest.mark.parametrize("loader", [load_model, load_tokenizer], ids=["model", "tokenizer"])
def test_missing_model_path_is_refused(tmp_path: Path, loader) -> None:
    missing = str(tmp_path / "no-such-model")
    args = ModelArguments(model_name_or_path=missing)
    call = (lambda: loader(args, task_of("a", "b"))) if loader is load_model else (lambda: loader(args))
    with pytest.raises(ConfigError, match=f"--model_name_or_path '{missing}' could not be loaded.*Offline?"):
        call()


def test_missing_smoke_assets_message_says_how_to_create_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a repo where someone ran the smoke module would have the folder
    with pytest.raises(ConfigError, match=f"Create the smoke assets first: python -m {PACKAGE}.smoke"):
        load_model(ModelArguments(model_name_or_path="smoke_assets/tiny-bert"), task_of("a", "b"))
    with pytest.raises(ConfigError, match=f"python -m {PACKAGE}.smoke"):
        load_tokenizer(ModelArguments(model_name_or_path="smoke_assets/tiny-bert"))


def test_missing_smoke_assets_hint_also_for_a_dotted_or_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("./smoke_assets/tiny-bert", str(tmp_path / "smoke_assets" / "tiny-bert")):
        with pytest.raises(ConfigError, match=f"python -m {PACKAGE}.smoke"):
            load_model(ModelArguments(model_name_or_path=name), task_of("a", "b"))


# ---- smoke assets ------------------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_make_smoke_assets_is_deterministic(tmp_path: Path) -> None:
    first, second = smoke.make_smoke_assets(tmp_path / "a"), smoke.make_smoke_assets(tmp_path / "b")
    files = sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file())
    assert {"train.jsonl", "validation.jsonl", "tiny-bert/config.json", "tiny-bert/model.safetensors"} <= set(files)
    assert files == sorted(str(p.relative_to(second)) for p in second.rglob("*") if p.is_file())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    weights_a, weights_b = (load_file(d / "tiny-bert" / "model.safetensors") for d in (first, second))
    assert all(torch.equal(weights_a[key], weights_b[key]) for key in weights_a)
    other_seed = smoke.make_smoke_assets(tmp_path / "c", seed=1)
    assert (other_seed / "train.jsonl").read_bytes() != (first / "train.jsonl").read_bytes()


def test_smoke_data_sizes_and_label_balance(tmp_path: Path) -> None:
    assets = smoke.make_smoke_assets(tmp_path)
    train, validation = read_jsonl(assets / "train.jsonl"), read_jsonl(assets / "validation.jsonl")
    assert (len(train), len(validation)) == (512, 101)  # odd eval size on purpose
    for rows in (train, validation):
        assert {row["label"] for row in rows} == {"negative", "positive"}
        assert 0.4 < sum(row["label"] == "positive" for row in rows) / len(rows) < 0.6
    lengths = sorted(len(row["text"].split()) for row in train)
    assert lengths[0] >= 6 and lengths[-1] <= 120
    assert lengths[-1] > 4 * lengths[len(lengths) // 2]  # long-tailed, so length grouping matters


def test_smoke_texts_are_learnable_and_fully_in_vocabulary(tmp_path: Path) -> None:
    assets = smoke.make_smoke_assets(tmp_path)
    validation = read_jsonl(assets / "validation.jsonl")
    positive, negative = set(smoke.POSITIVE), set(smoke.NEGATIVE)

    def rule(text: str) -> str:
        words = text.split()
        return "positive" if sum(w in positive for w in words) > sum(w in negative for w in words) else "negative"

    accuracy = sum(rule(row["text"]) == row["label"] for row in validation) / len(validation)
    assert accuracy > 0.9
    tokenizer = smoke.build_tokenizer()
    ids = tokenizer([row["text"] for row in validation])["input_ids"]
    assert all(tokenizer.unk_token_id not in row for row in ids)


def test_conftest_smoke_assets_match_the_shared_sizes(smoke_assets: Path) -> None:
    assert len(read_jsonl(smoke_assets / "train.jsonl")) == TRAIN_SIZE
    assert len(read_jsonl(smoke_assets / "validation.jsonl")) == EVAL_SIZE



# ---- smoke assets: pairs, regression and multi-label tasks --------------------------------------

TASK_COLUMNS = {
    "pairs": {"sentence1": str, "sentence2": str, "label": str},
    "regression": {"text": str, "label": float},  # 1.0, not 1, so datasets reads a float column
    "multilabel": {"text": str, "labels": list},
}


def sentiment_of(text: str) -> str:
    words = text.split()
    positive, negative = sum(w in smoke.POSITIVE for w in words), sum(w in smoke.NEGATIVE for w in words)
    return "positive" if positive > negative else "negative"


@pytest.mark.parametrize("task", list(TASK_COLUMNS))
def test_smoke_task_files_hold_their_columns_and_types_in_vocabulary(smoke_assets: Path, task: str) -> None:
    tokenizer = smoke.build_tokenizer()
    for split, size in (("train", TRAIN_SIZE), ("validation", EVAL_SIZE)):
        rows = read_jsonl(smoke_assets / task / f"{split}.jsonl")
        assert len(rows) == size
        assert all({key: type(value) for key, value in row.items()} == TASK_COLUMNS[task] for row in rows)
        texts = [" ".join(row[key] for key in ("text", "sentence1", "sentence2") if key in row) for row in rows]
        assert all(6 <= len(text.split()) <= 40 for text in texts)
        assert all(tokenizer.unk_token_id not in ids for ids in tokenizer(texts)["input_ids"])


def test_smoke_tasks_give_the_same_bytes_for_the_same_arguments(tmp_path: Path) -> None:
    first, second, other = (smoke.make_smoke_assets(tmp_path / name, 64, 11, seed)
                            for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    for name in (f"{task}/{split}.jsonl" for task in TASK_COLUMNS for split in ("train", "validation")):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
        assert (first / name).read_bytes() != (other / name).read_bytes(), name


def test_smoke_pairs_are_balanced_and_sentence1_alone_does_not_tell_the_label(smoke_assets: Path) -> None:
    rows = read_jsonl(smoke_assets / "pairs" / "train.jsonl")
    assert sum(row["label"] == "same" for row in rows) == len(rows) // 2
    for sentiment in ("negative", "positive"):
        labels = [row["label"] for row in rows if sentiment_of(row["sentence1"]) == sentiment]
        assert 0.4 < labels.count("same") / len(labels) < 0.6, sentiment
    # Both sentences together decide it: the label is the comparison of their sentiments.
    assert all((sentiment_of(row["sentence1"]) == sentiment_of(row["sentence2"])) == (row["label"] == "same")
               for row in rows)


def test_smoke_regression_score_grows_with_the_share_of_positive_words(smoke_assets: Path) -> None:
    rows = read_jsonl(smoke_assets / "regression" / "train.jsonl")
    shares = [sum(w in smoke.POSITIVE for w in words) / sum(w in smoke.POSITIVE + smoke.NEGATIVE for w in words)
              for words in (row["text"].split() for row in rows)]
    scores = [row["label"] for row in rows]
    assert min(scores) >= 0.0 and max(scores) <= 5.0
    assert np.corrcoef(shares, scores)[0, 1] > 0.95


def test_smoke_multilabel_has_texts_with_no_topic_and_with_several(smoke_assets: Path) -> None:
    rows = read_jsonl(smoke_assets / "multilabel" / "train.jsonl")
    counts = [len(row["labels"]) for row in rows]
    assert set(counts) == {0, 1, 2, 3}
    assert counts.count(0) > len(rows) / 10 and sum(count >= 2 for count in counts) > len(rows) / 4
    # A topic is named exactly when one of its words is in the text.
    for row in rows:
        text = set(row["text"].split())
        assert row["labels"] == [topic for topic, words in smoke.TOPICS.items() if text & set(words)]
