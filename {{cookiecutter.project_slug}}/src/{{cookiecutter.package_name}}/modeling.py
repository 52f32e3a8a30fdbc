"""Tokenizer and model loading from the Hub or a local save_pretrained folder."""

from __future__ import annotations

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .config import ConfigError, ModelArguments, check_local_path, model_not_found
from .data import Task


def load_tokenizer(model_args: ModelArguments) -> PreTrainedTokenizerBase:
    name = model_args.tokenizer_name or model_args.model_name_or_path
    check_local_path(name)
    try:
        return AutoTokenizer.from_pretrained(
            name,
            cache_dir=model_args.cache_dir,
            revision=model_args.revision,
            trust_remote_code=model_args.trust_remote_code,
        )
    except (OSError, ValueError) as err:
        raise model_not_found(name, type(err).__name__) from None


def load_model(model_args: ModelArguments, task: Task) -> PreTrainedModel:
    """Load a sequence classifier in fp32, with one output per class (one for regression), and the task
    in its config: problem type, label names, input columns and max_seq_length (Task.as_config)."""
    name, names = model_args.model_name_or_path, task.label_names
    check_local_path(name)
    try:
        config = AutoConfig.from_pretrained(
            name,
            num_labels=task.num_labels,
            **({"id2label": dict(enumerate(names)), "label2id": {label: i for i, label in enumerate(names)}}
               if names else {}),
            cache_dir=model_args.cache_dir,
            revision=model_args.revision,
            trust_remote_code=model_args.trust_remote_code,
        )
        config.update(task.as_config())
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
            f"--model_name_or_path {name!r} has a classifier for another number of outputs than the "
            f"{task.num_labels} this data needs; pass --ignore_mismatched_sizes true to start a fresh head"
        ) from None
    except (OSError, ValueError) as err:
        raise model_not_found(name, type(err).__name__) from None
    return model
