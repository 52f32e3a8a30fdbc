"""Command-line and YAML arguments: one dataclass per concern, read by HfArgumentParser.

Every default lives in a field below; `--help` prints them all. A YAML (or JSON) file given as the
first argument sets values, and flags after it override the file.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
import yaml
from transformers import HfArgumentParser

from .distributed import env_world_size, resolve_device_settings

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


class ConfigError(ValueError):
    """A bad setting; the message says which one and what is accepted."""


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        metadata={"help": "Hub model id (e.g. bert-base-uncased) or a local folder made with save_pretrained."}
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer id or folder, if not the same as model_name_or_path."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to cache models and datasets."})
    revision: str = field(default="main", metadata={"help": "Model revision: branch, tag or commit id."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow model code from the Hub. Only for repos you trust."}
    )
    ignore_mismatched_sizes: bool = field(
        default=False,
        metadata={"help": "Start a fresh classifier head when the checkpoint's has another number of labels."},
    )


@dataclass
class DataArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset id, e.g. imdb."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Dataset configuration name."})
    train_file: str | None = field(default=None, metadata={"help": "Local train file: csv, json, jsonl or parquet."})
    validation_file: str | None = field(
        default=None, metadata={"help": "Local validation file, same format as train_file."}
    )
    validation_split_percentage: int = field(
        default=5,
        metadata={"help": "Percent of train held out for evaluation when there is no validation or test split."},
    )
    text_column: str = field(default="text", metadata={"help": "Column holding the input text."})
    label_column: str = field(default="label", metadata={"help": "Column holding the label (int or string)."})
    max_seq_length: int = field(default=512, metadata={"help": "Longer inputs are truncated."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N train examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N eval examples."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})

    def __post_init__(self) -> None:
        if self.dataset_name is None and self.train_file is None:
            raise ConfigError("--dataset_name or --train_file is required; pass a Hub dataset id or a local file")
        for name in ("train_file", "validation_file"):
            path = getattr(self, name)
            if path is not None and not path.endswith((".csv", ".json", ".jsonl", ".parquet")):
                raise ConfigError(f"--{name} {path!r}: unsupported format; use .csv, .json, .jsonl or .parquet")
        if self.max_seq_length < 1:
            raise ConfigError(f"--max_seq_length {self.max_seq_length}: must be >= 1")
        if not 0 < self.validation_split_percentage < 100:
            raise ConfigError("--validation_split_percentage must be between 1 and 99")


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    """HF TrainingArguments with this project's defaults and automatic device, backend and precision.

    Both training loops read these flags, so `--learning_rate` or `--save_steps` mean the same thing
    whichever loop the project was generated with.
    """

    mixed_precision: str = field(
        default="auto",
        metadata={
            "help": "auto: bf16 on GPUs that support it, else fp16; fp32 on CPU. Or bf16, fp16 (CUDA only), no.",
            "choices": ["auto", "bf16", "fp16", "no"],
        },
    )
    # Batches of similar length carry little padding. On imdb-like lengths padding fell from 56% of
    # all tokens to 6% and training ran 2.9x faster (the template's bench/length_grouping.py).
    train_sampling_strategy: str = field(
        default="group_by_length",
        metadata={
            "help": "random, sequential, group_by_length or batch_rebalance.",
            "choices": ["random", "sequential", "group_by_length", "batch_rebalance"],
        },
    )
    # BERT uses every parameter on every step; searching for unused ones costs a graph walk per step.
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "Passed to DistributedDataParallel(find_unused_parameters=...)."}
    )
    # The collator drops helper columns itself; keeping them lets the length sampler read "length".
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Drop dataset columns the model does not take, before collation."}
    )
    output_dir: str | None = field(default="outputs", metadata={"help": "Checkpoints, final model, metrics.json."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N optimizer steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most this many checkpoints."})

    def __post_init__(self) -> None:
        # Decide device, backend and precision before the parent sets up devices: on a CPU-only
        # machine the Trainer trains each rank alone unless use_cpu is set, and gloo alone does not
        # make the ranks synchronise gradients.
        try:
            settings = resolve_device_settings(
                self.mixed_precision,
                fp16=self.fp16,
                bf16=self.bf16,
                use_cpu=self.use_cpu,
                ddp_backend=self.ddp_backend,
            )
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.use_cpu = settings.use_cpu
        self.ddp_backend = settings.ddp_backend
        self.fp16 = settings.precision == "fp16"
        self.bf16 = settings.precision == "bf16"
        if self.train_sampling_strategy == "group_by_length" and self.accelerator_config is None:
            # The length-grouped sampler shuffles with the global torch RNG, which drifts apart
            # between ranks after the first epoch (dropout draws per element), so the ranks' shards
            # would overlap. Without the seedable sampler, accelerate gives the sampler a generator
            # and broadcasts its state from rank 0 at the start of every epoch.
            self.accelerator_config = {"use_seedable_sampler": False}
        if not self.use_cpu and env_world_size() > 1:
            # The parent starts the NCCL process group; pin this rank's GPU first, or every rank
            # would set up its communicator on GPU 0.
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        super().__post_init__()
        # The parent fills an attribute of this name from ACCELERATE_MIXED_PRECISION and hands it
        # to accelerate; keep it equal to what was resolved above.
        self.mixed_precision = settings.precision


def split_config_path(argv: list[str]) -> tuple[Path | None, list[str]]:
    """Return (config file, remaining flags) when the first argument is a YAML or JSON file."""
    if argv and not argv[0].startswith("-") and argv[0].endswith(CONFIG_SUFFIXES):
        path = Path(argv[0])
        if not path.is_file():
            raise ConfigError(f"config file {argv[0]!r} not found; pass a path to a .yaml, .yml or .json file")
        return path, argv[1:]
    return None, argv


def load_config_file(path: Path) -> dict:
    text = path.read_text()
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"config file {str(path)!r} is not valid {path.suffix[1:].upper()}: {err}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of flag names to values")
    return values


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """Parse `[CONFIG] [--flag value ...]`: the file sets values, the flags override them."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    config_path, flags = split_config_path(argv)
    if config_path is not None:
        values = load_config_file(config_path)
        actions = {action.dest: action for action in parser._actions}
        unknown = sorted(set(values) - set(actions))
        if unknown:
            raise ConfigError(f"{config_path}: unknown setting(s) {', '.join(unknown)}; see --help for the names")
        for name, value in values.items():
            # argparse checks choices on the command line only, never on defaults.
            choices = actions[name].choices
            if choices is not None and value not in choices:
                raise ConfigError(f"{config_path}: {name}: {value!r} is not one of {', '.join(map(str, choices))}")
        parser.set_defaults(**values)
        for action in parser._actions:
            if action.dest in values:
                action.required = False
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=flags)
    return model_args, data_args, training_args
