"""config.py: a YAML or JSON file, then flags, parsed with this loop's own TrainingArguments.

Every project has training_args.py, so each test here holds for either loop. Files are written into
tmp_path; no network.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, REQUIRED, names_from, package_module, parse_args

ConfigError = names_from("config", "ConfigError")
TrainingArguments = package_module("training_args").TrainingArguments  # the rendered loop's own

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


def write_yaml(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_yaml_sets_values_and_flags_after_it_override_them(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "run.yaml", (
        "model_name_or_path: from/yaml\ntrain_file: data/train.csv\nlearning_rate: 1e-3\n"  # text to PyYAML (YAML 1.1)
        "seed: 7\nmax_seq_length: 64\nnum_train_epochs: 3\n"
    ))
    model_args, data_args, training_args = parse_args([config, "--learning_rate", "0.005", "--seed", "9"])
    assert training_args.learning_rate == 0.005  # flag
    assert training_args.seed == 9  # flag
    assert training_args.num_train_epochs == 3  # yaml
    assert data_args.max_seq_length == 64  # yaml
    assert (model_args.model_name_or_path, data_args.train_file) == ("from/yaml", "data/train.csv")
    _, _, from_yaml_only = parse_args([config])
    assert from_yaml_only.learning_rate == 0.001 and isinstance(from_yaml_only.learning_rate, float)


def test_json_config_is_read_like_yaml(tmp_path: Path) -> None:
    config = tmp_path / "run.json"
    config.write_text(json.dumps(
        dict(model_name_or_path="from/json", train_file="t.parquet", learning_rate=0.002, max_seq_length=32)
    ))
    model_args, data_args, training_args = parse_args([str(config), "--max_seq_length", "16"])
    assert (model_args.model_name_or_path, data_args.train_file) == ("from/json", "t.parquet")
    assert training_args.learning_rate == 0.002
    assert data_args.max_seq_length == 16


def test_unknown_yaml_key_is_refused_by_name(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "run.yaml", "model_name_or_path: m\ntrain_file: t.jsonl\nlearning_rat: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) learning_rat;"):
        parse_args([config])


def test_an_unknown_flag_or_a_value_argparse_refuses_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="^unrecognized arguments: --lerning_rate 0.1 "):
        parse_args([*REQUIRED, "--lerning_rate", "0.1"])
    with pytest.raises(ConfigError, match="^argument --seed: invalid int value: 'x'$"):
        parse_args([*REQUIRED, "--seed", "x"])


def test_missing_config_file_or_one_after_the_flags_is_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=f"config file '{missing}' not found"):
        parse_args([missing])
    with pytest.raises(ConfigError, match="^config file 'run.yaml' comes after flags: pass it first, then the flags$"):
        parse_args([*REQUIRED, "--learning_rate", "0.1", "run.yaml"])


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
    if isinstance(parsed.get("report_to"), list) and "report_to" in values:
        values["report_to"] = [values["report_to"]]  # the Trainer's shape since transformers 5.25 (5.24: the string)
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


def test_nothing_to_do_is_refused_and_do_eval_false_holds_under_an_eval_strategy() -> None:
    with pytest.raises(ConfigError, match="--do_train false and --do_eval false leave nothing to do"):
        parse_args([*REQUIRED, "--do_train", "false", "--do_eval", "false"])
    assert parse_args([*REQUIRED, "--eval_strategy", "epoch", "--do_eval", "false"])[2].do_eval is False


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
    ([*REQUIRED, "--max_train_samples", "0"], "^--max_train_samples 0: must be >= 1$"),
    ([*REQUIRED, "--dataloader_num_workers", "-1"], "^--dataloader_num_workers -1: must be >= 0$"),
    ([*REQUIRED, "--ddp_timeout", "0"], "^--ddp_timeout 0: must be >= 1$"),
    ([*REQUIRED, "--output_dir", str(REPO_ROOT / "pyproject.toml")], "pyproject.toml' is a file: pass a folder$"),
], ids=["no-data", "train-suffix", "validation-suffix", "max-seq-length-0", "split-100", "hub-and-file",
        "validation-without-train", "train-samples-0", "loader-workers-negative", "timeout-0", "output-dir-file"])
def test_bad_settings_are_refused_naming_their_flag(flags: list[str], message: str) -> None:
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


@pytest.mark.parametrize(("line", "message"), [
    ("problem_type: binary", r"^argument --problem_type/--problem-type: invalid choice: 'binary' \(choose from "),
    ("per_device_train_batch_size: 8.5", "^argument --per_device_train_batch_size/.*: invalid int value: '8.5'$"),
    ("learning_rate: [1, 2]", r"^argument --learning_rate/--learning-rate: invalid float value: '\[1, 2\]'$"),
    ('do_eval: "maybe"', "^argument --do_eval/--do-eval: Truthy value expected: got maybe"),
    ("model_name_or_path: null", "model_name_or_path is empty: give it a value, or leave it out for its default$"),
], ids=["choice", "int", "float", "bool", "required-null"])
def test_a_config_file_value_is_checked_as_its_flag_would_be(tmp_path: Path, line: str, message: str) -> None:
    config = write_yaml(tmp_path / "run.yaml", f"model_name_or_path: m\ntrain_file: t.jsonl\n{line}\n")
    with pytest.raises(ConfigError, match=message):
        parse_args([config])


def test_yaml_reads_no_and_yes_as_text_and_a_mapping_as_json(tmp_path: Path) -> None:
    """YAML 1.1 (PyYAML) reads unquoted no, yes, on, off as booleans: `save_strategy: no` would be False."""
    config = write_yaml(tmp_path / "run.yaml", (
        "model_name_or_path: m\ntrain_file: t.jsonl\nmixed_precision: no\nsave_strategy: no\ndo_eval: no\n"
        "lr_scheduler_type: cosine_with_min_lr\nlr_scheduler_kwargs: {min_lr_rate: 0.1}\n"))
#% if cookiecutter.training_loop == "trainer"
    lists = write_yaml(tmp_path / "lists.yaml", "model_name_or_path: m\ntrain_file: t.jsonl\nlabel_names: [a, b]\n")
    assert parse_args([lists])[2].label_names == ["a", "b"]  # a list: one flag of several values
#% endif
    _, _, args = parse_args([config])
    assert (args.mixed_precision, args.save_strategy, args.do_eval) == ("no", "no", False)
    assert args.lr_scheduler_kwargs == {"min_lr_rate": 0.1}


def test_a_checkpoint_resumes_on_another_world_size_with_its_global_batch(tmp_path: Path) -> None:
    """Both loops: a job stopped on 2 processes comes back on 1 or 4 and accumulates to the same global batch."""
    accumulation_to_resume, config = package_module("resume").accumulation_to_resume, package_module("config")
    (tmp_path / config.BATCH_PLAN).write_text(json.dumps(config.batch_split(2, 8, 1)))
    assert accumulation_to_resume(None, 8, 3, world_size=2) == 3  # a new run: the flag's
    assert accumulation_to_resume(tmp_path, 8, 1, world_size=1) == 2
    assert accumulation_to_resume(tmp_path, 2, 1, world_size=4) == 2
    assert accumulation_to_resume(tmp_path, 4, 2, world_size=2) == 2  # the same global batch, split otherwise
    refusal = (r"^the checkpoint's global batch of 16 \(2 processes x 8 x 1 accumulation steps\) cannot be made "
               r"from --per_device_train_batch_size 3 on 1 processes")
    with pytest.raises(ConfigError, match=refusal):
        accumulation_to_resume(tmp_path, 3, 1, world_size=1)
    with pytest.raises(ConfigError, match=r"was written by a run with a global batch of 16 .* but this run has a "
                                          r"global batch of 48 "):
        accumulation_to_resume(tmp_path, 8, 3, world_size=2)
