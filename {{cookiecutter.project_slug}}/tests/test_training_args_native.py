"""The native loop's own flags: exactly what it implements, under the names and defaults of
transformers.TrainingArguments, so that a config file moves between the loops."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import transformers
from conftest import PACKAGE, REQUIRED, package_module, run_env, run_python

config = package_module("config")
ConfigError = config.ConfigError
TrainingArguments = package_module("training_args").TrainingArguments
PARALLEL_FLAGS = {field.name for field in dataclasses.fields(package_module("parallel").ParallelArguments)}

# The project's own flag; the Trainer variant adds it to transformers.TrainingArguments as well.
PROJECT_FLAGS = {"mixed_precision"}
# Where this loop's default differs from transformers.TrainingArguments', on purpose.
OWN_DEFAULTS = {
    "output_dir": "outputs",  # transformers: None, which it then refuses
    "do_train": True,  # transformers' do_* only inform scripts; here they choose what runs
    "do_eval": True,
    "train_sampling_strategy": "group_by_length",  # little padding: 2.9x faster on imdb-like lengths
    "logging_steps": 10,
    "save_total_limit": 2,
    # transformers' None means "decide at run time"; the Trainer variant sets False too (BERT uses every parameter).
    "ddp_find_unused_parameters": False,
    "ddp_broadcast_buffers": False,  # None: DDP's own True; these models' buffers never change
    "disable_tqdm": False,  # None: on unless the log level hides it
    "dataloader_num_workers": None,  # 0: here None sizes the loaders to this process's share of the CPUs
    "gradient_checkpointing": False,  # None: transformers' deprecated alias of activation_checkpointing
}


def parse(*flags: str) -> TrainingArguments:
    return config.parse_args(TrainingArguments, [*REQUIRED, *flags])[2]


def transformers_default(field: dataclasses.Field):
    return field.default_factory() if field.default is dataclasses.MISSING else field.default


def test_every_flag_has_a_transformers_namesake_and_its_default_except_the_documented_ones() -> None:
    names = {field.name for field in dataclasses.fields(transformers.TrainingArguments)}
    assert sorted(field.name for field in dataclasses.fields(TrainingArguments) if field.name not in names) \
        == sorted(PROJECT_FLAGS)
    theirs = {field.name: transformers_default(field) for field in dataclasses.fields(transformers.TrainingArguments)}
    # parallel.py's own flags (ParallelArguments), where it has any, are its tests' (test_parallel.py).
    ours = {field.name: field.default for field in dataclasses.fields(TrainingArguments)
            if field.name in theirs.keys() - PARALLEL_FLAGS}
    differing = {name: default for name, default in ours.items() if default != theirs[name]}
    # transformers takes fused AdamW by default from torch 2.8 on; this loop on every torch it supports.
    fused = {} if theirs["optim"] == "adamw_torch_fused" else {"optim": "adamw_torch_fused"}
    assert differing == OWN_DEFAULTS | fused


@pytest.mark.usefixtures("isolated_process")
def test_precision_is_left_to_the_run_start_which_refuses_contradictory_flags() -> None:
    """Each process resolves it when it picks its device (train.setup_distributed); the Trainer variant's differs."""
    parsed = parse()
    assert (parsed.mixed_precision, parsed.fp16, parsed.bf16, parsed.use_cpu) == ("auto", False, False, False)
    args = parse("--use_cpu", "true", "--fp16", "true", "--bf16", "true")
    with pytest.raises(ConfigError, match="--fp16 and --bf16"):
        package_module("train").setup_distributed(args)


@pytest.mark.parametrize("flags", [
    ["--label_smoothing_factor", "0.1"],
    ["--push_to_hub", "true"],
    ["--activation_checkpointing", "true"],  # transformers' new name for --gradient_checkpointing, which is here
    ["--accelerator_config", '{"split_batches": true}'],
    ["--remove_unused_columns", "true"],
], ids=lambda flags: flags[0])
def test_a_trainer_only_flag_is_refused_by_the_parser(flags: list[str]) -> None:
    with pytest.raises(ConfigError, match=f"^unrecognized arguments: {re.escape(' '.join(flags))} "):
        parse(*flags)


@pytest.mark.parametrize(("flag", "value"), [
    #% if cookiecutter.experiment_tracker != "none"
    ("--report_to", "comet_ml"),
    #% endif
    ("--optim", "sgd"),
    ("--train_sampling_strategy", "batch_rebalance"),
    ("--lr_scheduler_type", "reduce_lr_on_plateau"),  # its step() wants an eval metric
    ("--save_strategy", "best"),
    ("--ddp_backend", "mpi"),
])
def test_a_trainer_only_value_is_refused_by_the_parser(flag: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^argument {flag}.*: invalid choice: '{value}'"):
        parse(flag, value)


def test_a_config_file_with_a_trainer_only_key_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "trainer.yaml"
    path.write_text("model_name_or_path: m\ntrain_file: t.jsonl\nlabel_smoothing_factor: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) label_smoothing_factor;"):
        config.parse_args(TrainingArguments, [str(path)])


def test_the_flags_it_implements_are_parsed_to_their_types() -> None:
    expected = dict(optim="adamw_torch", eval_strategy="steps", eval_steps=5, do_train=False, dataloader_num_workers=2,
                    lr_scheduler_type="cosine", max_grad_norm=0.5, ddp_timeout=60, train_sampling_strategy="random",
                    dataloader_drop_last=True, warmup_steps=0.1, tf32=False)
    parsed = parse(*(text for name, value in expected.items() for text in (f"--{name}", str(value).lower())),
                   "--no_dataloader_pin_memory")
    assert {name: getattr(parsed, name) for name in expected} == expected
    assert parsed.dataloader_pin_memory is False
    parsed = parse("--logging_steps", "0.25", "--save_steps", "0.5", "--eval_steps", "1")  # fractions below 1
    assert (parsed.logging_steps, parsed.save_steps, parsed.eval_steps) == (0.25, 0.5, 1)


@pytest.mark.slow  # a real launch
def test_help_is_short_and_lists_only_this_loops_flags() -> None:
    result = run_python(["-m", f"{PACKAGE}.train", "--help"], timeout=120, env=run_env(COLUMNS="80"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 170  # the fullest render lists 168, and a longer package name wraps one more line
    listed = set(re.findall(r"^  --(\w+)", result.stdout, flags=re.MULTILINE))
    # The flags of the dataclasses parse_args fills.
    fields = {field.name for parsed in config.parse_args(TrainingArguments, REQUIRED)
              for field in dataclasses.fields(parsed)}
    # HfArgumentParser adds --no_<flag> for a bool flag that defaults to true.
    assert {name.removeprefix("no_") if name.removeprefix("no_") in fields else name for name in listed} == fields


WHOLE_OR_FRACTION = "use a whole number of steps, or a fraction of the run below 1"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--save_steps", "0", f"--save_steps 0.0: {WHOLE_OR_FRACTION}"),
    ("--eval_steps", "-1", f"--eval_steps -1.0: {WHOLE_OR_FRACTION}"),
])
def test_bad_step_intervals_are_refused(flag: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(flag, value)
