"""Command-line and YAML arguments: the model and data dataclasses, and the parser both loops use.

Every default lives in a dataclass field (`--help` prints them); the training flags are the loop's own,
in training_args.py."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field, fields
from itertools import pairwise
from pathlib import Path
from typing import Any, NoReturn

import torch
import yaml
from transformers import HfArgumentParser

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
FILE_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}  # datasets' readers
DATA_SUFFIXES = tuple(FILE_BUILDERS)
# transformers' names (PretrainedConfig.problem_type); auto decides from the label column.
PROBLEM_TYPES = ["auto", "single_label_classification", "multi_label_classification", "regression"]


class ConfigError(ValueError):
    """A bad setting; the message says which one and what is accepted."""


def flag(default, help: str, choices: list | None = None):  # noqa: A002 - argparse's own word
    metadata = {"help": help} if choices is None else {"help": help, "choices": choices}
    return field(default=default, metadata=metadata)


@dataclass
class ModelArguments:
    model_name_or_path: str = field(metadata={"help": "Hub id or save_pretrained folder."})
    tokenizer_name: str | None = flag(None, "If not model_name_or_path's.")
    cache_dir: str | None = flag(None, "Cache for models and datasets.")
    revision: str = flag("main", "Branch, tag or commit.")
    trust_remote_code: bool = flag(False, "Run model code from the Hub.")
    ignore_mismatched_sizes: bool = flag(False, "New head if label counts differ.")


@dataclass
class DataArguments:
    dataset_name: str | None = flag(None, "Hub dataset id, e.g. imdb.")
    dataset_config_name: str | None = flag(None, "Hub dataset configuration.")
    train_file: str | None = flag(None, "csv, json, jsonl or parquet file.")
    validation_file: str | None = flag(None, "Same format as train_file.")
    validation_split_percentage: int = flag(5, "Percent of train held out if no eval split.")
    test_file: str | None = flag(None, "Rows to predict with --do_predict.")
    text_column: str = flag("text", "Column of input text.")
    text_pair_column: str | None = flag(None, "Second text, for sentence pairs.")
    label_column: str = flag("label", "Column of labels.")
    problem_type: str = flag("auto", "auto: floats regression, lists multi-label, else single.",
                             PROBLEM_TYPES)
    label_delimiter: str | None = flag(None, "Split text labels on it (multi-label).")
    multi_label_threshold: float = flag(0.5, "Multi-label: predict above this.")
    max_seq_length: int = flag(512, "Longer inputs are truncated.")
    max_train_samples: int | None = flag(None, "Keep the first N train examples.")
    max_eval_samples: int | None = flag(None, "Keep the first N eval examples.")
    preprocessing_num_workers: int | None = flag(None, "Tokenising processes; 0, 1: this one.")

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_file is None:
            raise ConfigError("--dataset_name or --train_file is required; pass a Hub dataset id or a local file")
        if self.dataset_name is not None and self.train_file is not None:
            raise ConfigError(f"--dataset_name {self.dataset_name} and --train_file {self.train_file} are both "
                              "set; pass one (configs/local_files.yaml has no dataset_name)")
        if self.validation_file is not None and self.train_file is None:
            raise ConfigError(f"--validation_file {self.validation_file} needs --train_file; pass both")
        for name in ("train_file", "validation_file", "test_file"):
            path = getattr(self, name)
            if path is not None and not path.endswith(DATA_SUFFIXES):
                raise ConfigError(f"--{name} {path!r}: unsupported format; use .csv, .json, .jsonl or .parquet")
        for name in ("max_seq_length", "max_train_samples", "max_eval_samples"):  # None: every example
            if (value := getattr(self, name)) is not None and value < 1:
                raise ConfigError(f"--{name} {value}: must be >= 1")
        if self.text_pair_column in (self.text_column, self.label_column):
            raise ConfigError(f"--text_pair_column {self.text_pair_column}: use a column other than the text "
                              "and label columns")
        if not 0 < self.multi_label_threshold < 1:
            raise ConfigError(f"--multi_label_threshold {self.multi_label_threshold}: must be between 0 and 1")
        if not 0 < self.validation_split_percentage < 100:
            raise ConfigError("--validation_split_percentage must be between 1 and 99")
        check_preprocessing_num_workers(self.preprocessing_num_workers)


def check_preprocessing_num_workers(workers: int | None) -> None:
    """Training's DataArguments and predict.py's PredictArguments both take the flag."""
    if workers is not None and workers < 0:
        raise ConfigError(f"--preprocessing_num_workers {workers}: must be >= 0 (0 or 1 tokenises in this process)")


def check_training_settings(args: Any) -> None:
    """Batch sizes, loader workers, timeout, steps, output_dir and the schedule's settings (read into a dict),
    as both loops' TrainingArguments refuse them while parsing, so that the preflight, the Trainer and the
    native loop accept and refuse the same settings."""
    minimums = {"per_device_train_batch_size": 1, "per_device_eval_batch_size": 1, "ddp_timeout": 1,
                "gradient_accumulation_steps": 1, "dataloader_num_workers": 0}
    for name, least in minimums.items():
        if getattr(args, name) < least:
            raise ConfigError(f"--{name} {getattr(args, name)}: must be >= {least}")
    if args.do_train and args.max_steps <= 0 and args.num_train_epochs <= 0:
        raise ConfigError(f"--num_train_epochs {args.num_train_epochs} trains nothing: pass a number of "
                          "epochs > 0, or --max_steps > 0")
    for name in ("logging_steps", "save_steps", "eval_steps"):
        value = getattr(args, name)
        if value is not None and (value <= 0 or (value > 1 and value != int(value))):
            raise ConfigError(f"--{name} {value}: use a whole number of steps, or a fraction of the run below 1")
    if args.warmup_steps < 0:
        raise ConfigError(f"--warmup_steps {args.warmup_steps}: must be >= 0 (below 1: a fraction of all steps)")
    if args.output_dir and Path(args.output_dir).is_file():
        raise ConfigError(f"--output_dir {args.output_dir!r} is a file: pass a folder")
    args.lr_scheduler_kwargs = schedule_kwargs(args.lr_scheduler_type, args.lr_scheduler_kwargs)


def schedule_kwargs(schedule: str, kwargs: dict | str | None) -> dict:
    """--lr_scheduler_kwargs as a dict (JSON on the command line), checked by building the schedule once: a
    setting it needs (cosine_with_min_lr's min_lr_rate) or does not take fails here, not in every worker."""
    from transformers import get_scheduler  # here: predict never needs its module, slow to import

    given = kwargs if isinstance(kwargs, str) else json.dumps(kwargs or {})
    try:
        kwargs = json.loads(kwargs) if isinstance(kwargs, str) else kwargs or {}
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        get_scheduler(schedule, optimizer, num_warmup_steps=0, num_training_steps=2,
                      scheduler_specific_kwargs=kwargs)
    except (TypeError, ValueError) as err:  # also JSON that does not parse
        raise ConfigError(f"--lr_scheduler_type {schedule}, --lr_scheduler_kwargs {given}: {err}") from None
    return kwargs


BATCH_PLAN = "batch_plan.json"  # in each checkpoint: how the run that wrote it batched its data


def batch_split(world_size: int, per_device_batch_size: int, accumulation_steps: int) -> dict[str, int]:
    """A run's global batch and how it splits it, as both loops record them in batch_plan.json."""
    return {"global_batch_size": world_size * per_device_batch_size * accumulation_steps,
            "world_size": world_size, "per_device_train_batch_size": per_device_batch_size,
            "gradient_accumulation_steps": accumulation_steps}


def read_batch_plan(checkpoint: Path | None) -> dict[str, int] | None:
    if checkpoint is None or not Path(checkpoint, BATCH_PLAN).is_file():
        return None
    return json.loads(Path(checkpoint, BATCH_PLAN).read_text())


def describe_batch_plan(plan: dict[str, int]) -> str:
    processes = "1 process" if plan["world_size"] == 1 else f"{plan['world_size']} processes"
    per_device, accumulation = plan["per_device_train_batch_size"], plan["gradient_accumulation_steps"]
    text = (f"a global batch of {plan['world_size'] * per_device * accumulation} ({processes} x "
            f"--per_device_train_batch_size {per_device} x --gradient_accumulation_steps {accumulation})")
    if "steps_per_epoch" in plan:
        text += f", {plan['train_size']} train examples and {plan['steps_per_epoch']} steps per epoch"
    return text


def check_same_batch_plan(checkpoint: Path, saved: dict[str, int], current: dict[str, int],
                          same: tuple[str, ...], advice: str) -> None:
    """Refuse to resume a checkpoint whose plan differs from this run's in any of the keys `same`: its place
    in the epoch counts its own steps. `advice` says what the loop can resume instead."""
    if [saved.get(key) for key in same] != [current.get(key) for key in same]:
        raise ConfigError(f"checkpoint {str(checkpoint)!r} was written by a run with "
                          f"{describe_batch_plan(saved)}, but this run has {describe_batch_plan(current)}. {advice}")


def check_batch_fits(train_size: int, world_size: int, per_device_batch_size: int, accumulation_steps: int) -> None:
    """One optimizer step must find its examples in the train set: the preflight and both loops check this."""
    global_batch = world_size * per_device_batch_size * accumulation_steps
    if global_batch > train_size:
        raise ConfigError(f"one optimizer step takes {global_batch} examples ({world_size} process(es) x "
                          f"--per_device_train_batch_size {per_device_batch_size} x --gradient_accumulation_steps "
                          f"{accumulation_steps}), more than the {train_size} train examples: lower them, start "
                          "fewer processes or add data")


def model_not_found(name: str, reason: str, flag: str = "--model_name_or_path") -> ConfigError:
    hint = "Offline? Use a local folder made with save_pretrained."
    if "smoke_assets" in Path(name).parts:
        hint = f"Create the smoke assets first: python -m {__package__}.smoke"
    return ConfigError(f"{flag} {name!r} could not be loaded ({reason}). {hint}")


def check_local_path(name: str, flag: str = "--model_name_or_path") -> None:
    """A missing local-looking path fails at once, instead of after the Hub client's retries."""
    looks_local = name.startswith((".", "/", "~")) or "smoke_assets" in Path(name).parts
    if looks_local and not Path(name).expanduser().exists():
        raise model_not_found(name, "no such folder", flag)


class Yaml12Loader(yaml.SafeLoader):
    """YAML 1.2's booleans, true and false only: no, yes, on and off stay text, as `mixed_precision: no`
    means (PyYAML reads YAML 1.1, where they are booleans)."""


Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile("^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def config_file_flags(argv: list[str], parser: HfArgumentParser) -> list[str]:
    """argv, with a first argument that names a YAML or JSON file replaced by the flags it holds:
    argparse then checks the file's values as it checks the command line's, which come after them
    and win."""
    if not argv or argv[0].startswith("-") or not argv[0].endswith(CONFIG_SUFFIXES):
        for before, arg in pairwise(argv):  # a file that is no flag's value
            if arg.endswith(CONFIG_SUFFIXES) and not before.startswith("-"):
                raise ConfigError(f"config file {arg!r} comes after flags: pass it first, then the flags")
        return argv
    path = Path(argv[0])
    if not path.is_file():
        raise ConfigError(f"config file {argv[0]!r} not found; pass a path to a .yaml, .yml or .json file")
    text = path.read_text()
    try:
        is_json = path.suffix == ".json"
        values = json.loads(text) if is_json else yaml.load(text, Loader=Yaml12Loader)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"config file {str(path)!r} is not valid {path.suffix[1:].upper()}: {err}") from None
    if values is not None and not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of flag names to values")
    settings = {item.name: item for types in parser.dataclass_types for item in fields(types)}
    if unknown := sorted(set(values or {}) - set(settings)):
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}; see --help for the names")
    flags = []
    for name, value in (values or {}).items():
        if value is None:
            raise ConfigError(f"{path}: {name} is empty: give it a value, or leave it out "
                              "for its default")
        if isinstance(value, list) and "list" in str(settings[name].type):
            flags += [f"--{name}", *map(str, value)]  # a flag of several values
        elif isinstance(value, dict):  # lr_scheduler_kwargs: JSON, as on the command line
            flags.append(f"--{name}={json.dumps(value)}")
        else:
            flags.append(f"--{name}={value}")
    return flags + argv[1:]


def parse_flags(parser: HfArgumentParser, argv: list[str] | None) -> tuple:
    """The parser's dataclasses. A flag it does not know or a value argparse refuses is a ConfigError, which
    the commands print as the other bad settings: one line (per node, under torchrun), exit status 2."""

    def refuse(message: str) -> NoReturn:
        raise ConfigError(message)

    parser.error = refuse
    *parsed, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:
        refuse(f"unrecognized arguments: {' '.join(unknown)} (see --help for the flags it takes)")
    return tuple(parsed)


def parse_args(training_args_class: type,
               argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, Any]:
    """Parse `[CONFIG] [--flag value ...]`: the file sets values, the flags override them."""
    #% if cookiecutter.include_lora
    from .lora import LoraArguments as ModelArguments  # with LoRA's flags (here: lora.py imports config)

    #% endif
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, training_args_class), usage="%(prog)s [CONFIG] [--flag value ...]",
        prog=f"python -m {__package__}.train",  # also when the launch scripts' preflight parses the flags
        description="CONFIG is a .yaml, .yml or .json file of flag values; flags after it override it.",
        allow_abbrev=False,  # a mistyped flag is an error, not silently another flag
    )
    model_args, data_args, training_args = parse_flags(parser, config_file_flags(argv, parser))
    if training_args.do_predict and data_args.test_file is None:
        raise ConfigError("--do_predict needs --test_file: the csv, json, jsonl or parquet rows to predict")
    if training_args.gradient_checkpointing and training_args.ddp_find_unused_parameters:
        # DDP searches for unused parameters when forward ends, before the backward pass recomputes the
        # checkpointed layers and uses theirs: it would count them unused, then ready a second time.
        raise ConfigError("--gradient_checkpointing with --ddp_find_unused_parameters true fails in DDP "
                          "(parameters marked ready twice); set --ddp_find_unused_parameters false, the default")
    return model_args, data_args, training_args
