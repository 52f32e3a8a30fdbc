"""Tokenizer and model loading from the Hub or a local save_pretrained folder."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .config import ConfigError, ModelArguments


def _not_found(name: str, reason: str) -> ConfigError:
    hint = "Offline? Use a local folder made with save_pretrained."
    if "smoke_assets" in Path(name).parts:
        hint = f"Create the smoke assets first: python -m {__package__}.smoke"
    return ConfigError(f"--model_name_or_path {name!r} could not be loaded ({reason}). {hint}")


def _check_local_path(name: str) -> None:
    """A missing local-looking path fails at once, instead of after the Hub client's retries."""
    looks_local = name.startswith((".", "/", "~")) or "smoke_assets" in Path(name).parts
    if looks_local and not Path(name).expanduser().exists():
        raise _not_found(name, "no such folder")


def load_tokenizer(model_args: ModelArguments) -> PreTrainedTokenizerBase:
    name = model_args.tokenizer_name or model_args.model_name_or_path
    _check_local_path(name)
    try:
        return AutoTokenizer.from_pretrained(
            name,
            cache_dir=model_args.cache_dir,
            revision=model_args.revision,
            trust_remote_code=model_args.trust_remote_code,
        )
    except (OSError, ValueError) as err:
        raise _not_found(name, type(err).__name__) from None


def load_model(model_args: ModelArguments, names: list[str]) -> PreTrainedModel:
    """Load a sequence classifier in fp32, with one output per class and the label names in its config."""
    name = model_args.model_name_or_path
    _check_local_path(name)
    try:
        config = AutoConfig.from_pretrained(
            name,
            num_labels=len(names),
            id2label=dict(enumerate(names)),
            label2id={label: i for i, label in enumerate(names)},
            cache_dir=model_args.cache_dir,
            revision=model_args.revision,
            trust_remote_code=model_args.trust_remote_code,
        )
        model = AutoModelForSequenceClassification.from_pretrained(
            name,
            config=config,
            cache_dir=model_args.cache_dir,
            revision=model_args.revision,
            trust_remote_code=model_args.trust_remote_code,
            ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
            # transformers 5 loads in the checkpoint's dtype by default. Many Hub checkpoints are stored
            # in fp16 or bf16; trained as such, AdamW loses small updates and GradScaler refuses fp16
            # gradients. The weights train in fp32; mixed precision is autocast's job.
            dtype=torch.float32,
        )
    except RuntimeError as err:
        if "ignore_mismatched_sizes" not in str(err):
            raise
        raise ConfigError(
            f"--model_name_or_path {name!r} has a classifier for another number of labels than the "
            f"{len(names)} in the data; pass --ignore_mismatched_sizes true to start a fresh head"
        ) from None
    except (OSError, ValueError) as err:
        raise _not_found(name, type(err).__name__) from None
    return model
