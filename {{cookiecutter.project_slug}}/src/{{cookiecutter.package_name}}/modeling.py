"""The tokenizer and the model, from the Hub or a save_pretrained folder, for both loops and predict."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

#% if cookiecutter.include_lora
from . import lora
#% endif
from .compat import attention_implementation
from .config import ConfigError, ModelArguments, check_local_path, model_not_found
from .data import MODEL_INPUTS, Task
from .distributed import some_of

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# transformers' model classes are imported where a model is built: the preflight imports them only for
# check_model_settings.

# How every model here loads:
# - float32, not the checkpoint's dtype (often fp16 or bf16 on the Hub): AdamW loses small updates to
#   half-precision weights and GradScaler refuses fp16 gradients. Mixed precision is autocast's job.
# - no Hub kernels: from transformers 5.25 (and its `kernels` dependency) a CUDA model switched to eval()
#   fetches some: offline the run fails after training, online it evaluates other code than it trained.
LOAD_OPTIONS = {"dtype": torch.float32, "use_kernels": False}
logger = logging.getLogger(__name__)


def hub_options(model_args: ModelArguments) -> dict:
    return {"cache_dir": model_args.cache_dir, "revision": model_args.revision,
            "trust_remote_code": model_args.trust_remote_code}


def from_pretrained(auto_class: type, name: str, flag: str = "--model_name_or_path", **options):
    """A missing or unreadable name is refused in one line that names its flag."""
    check_local_path(name, flag)
    try:
        return auto_class.from_pretrained(name, **options)
    except (OSError, ValueError) as err:
        raise model_not_found(name, type(err).__name__, flag) from None


def load_tokenizer(model_args: ModelArguments) -> PreTrainedTokenizerBase:
    name = model_args.tokenizer_name or model_args.model_name_or_path
    flag = "--tokenizer_name" if model_args.tokenizer_name else "--model_name_or_path"
    tokenizer = from_pretrained(AutoTokenizer, name, flag, **hub_options(model_args))
    pad_on_the_right(tokenizer, name)
    return tokenizer


def pad_on_the_right(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Pad with the eos token where there is no pad token (decoders such as Llama, GPT-2), on the right.

    The eos token: a new token would need a new embedding row, trained from nothing. The right: decoders
    number positions from the first token, pad or not, so GPT-2 would give an example padded on the left
    other logits than alone. Saved with the model, the tokenizer pads so in predict.py and pipeline too."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ConfigError(f"the tokenizer of {name!r} has neither a pad token nor an eos token to pad "
                              "with; pass --tokenizer_name with a tokenizer that has one of them")
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("the tokenizer of %s has no pad token: padding with its eos token %r (id %d)", name,
                    tokenizer.pad_token, tokenizer.pad_token_id)
    if tokenizer.padding_side != "right":
        logger.info("the tokenizer of %s pads on the %s: padding on the right instead, so that an example "
                    "gives the same logits alone and in a batch", name, tokenizer.padding_side)
        tokenizer.padding_side = tokenizer.init_kwargs["padding_side"] = "right"  # init_kwargs: what it saves


def load_model(model_args: ModelArguments, task: Task, tokenizer: PreTrainedTokenizerBase | None = None,
               freeze_unused: bool = False) -> PreTrainedModel:
    """A sequence classifier, one output per class (one for regression), with the task in its config
    (Task.as_config). A tokenizer's pad token becomes the config's: a decoder's head reads each row's logits
    at its last non-pad token, and without a pad token refuses batches of two rows or more."""
    name, labels = model_args.model_name_or_path, dict(enumerate(task.label_names))
    config = from_pretrained(
        AutoConfig, name, num_labels=task.num_labels, **hub_options(model_args),
        **({"id2label": labels, "label2id": {label: i for i, label in labels.items()}} if labels else {}),
    )
    config.update(task.as_config())
    if tokenizer is not None:
        config.pad_token_id = tokenizer.pad_token_id
    if getattr(config, "use_cache", None):
        config.use_cache = False  # a classifier never generates: no key/value cache to build
    from transformers import AutoModelForSequenceClassification

    try:
        model = from_pretrained(AutoModelForSequenceClassification, name, config=config, **LOAD_OPTIONS,
                                ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
                                **hub_options(model_args))
    except RuntimeError as err:
        if "ignore_mismatched_sizes" not in str(err):
            raise
        raise ConfigError(
            f"--model_name_or_path {name!r} has a classifier for another number of outputs than the "
            f"{task.num_labels} this data needs; pass --ignore_mismatched_sizes true to start a fresh head"
        ) from None
    #% if cookiecutter.include_lora
    model = lora.apply_adapters(model, model_args)  # with --lora_r > 0
    #% endif
    if freeze_unused:
        freeze_unused_parameters(model, example_inputs(tokenizer, task))
    trainable, total = parameter_counts(model).values()
    logger.info("parameters: %d trainable of %d (%.2f%%); attention: %s", trainable, total,
                100 * trainable / total, attention_implementation(model))
    return model


def example_inputs(tokenizer: PreTrainedTokenizerBase, task: Task) -> dict[str, torch.Tensor]:
    """One short example, tokenised as data.encode tokenises rows, with the inputs the collator keeps."""
    text = "a short example"
    encoded = tokenizer([text], [text] if task.text_pair_column else None, return_tensors="pt")
    return {key: value for key, value in encoded.items() if key in MODEL_INPUTS}


def unused_parameters(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> list[str]:
    """The names of the trainable parameters that one forward on inputs never reaches.

    Found as DDP's find_unused_parameters finds them, walking the autograd graph back from the logits to
    its AccumulateGrad leaves: no backward, no gradients allocated, and in eval mode no dropout draws from
    the RNG. A reentrant checkpoint hides its layers from the walk: call this before checkpointing is on."""
    was_training = model.training
    model.eval()
    try:
        logits = model(**inputs).logits
    finally:
        model.train(was_training)
    reached, seen, nodes = set(), set(), [logits.grad_fn]
    while nodes:
        node = nodes.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):
            reached.add(id(node.variable))
        nodes.extend(next_node for next_node, _ in node.next_functions)
    return [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in reached]


def freeze_unused_parameters(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    """Freeze the trainable parameters the classification forward never uses, and name them in one line.

    Some architectures carry weights their head skips (BigBird's pooler, ESM's contact head, XLNet's mask
    embedding). Without a gradient they never learn, and DDP, which reduces a bucket once all its parameters
    have gradients, would never reduce theirs: the ranks' gradients would part at the first step. A model
    using other parameters on other inputs (a mixture of experts) needs --ddp_find_unused_parameters true."""
    unused = unused_parameters(model, inputs)
    for name in unused:
        model.get_parameter(name).requires_grad_(False)
    if unused:
        logger.info("froze %s: the classification forward never uses them, so they could not learn, and DDP "
                    "would wait for their gradients", some_of(unused))


def check_labels_fit(model_dir: Path, task: Task, what: str, same_names: bool = False) -> None:
    """A local model must have a head of the size the task needs; a checkpoint, the same labels."""
    config = model_dir / "config.json"
    if not config.is_file():  # a Hub id: the workers check it once downloaded
        return
    values = json.loads(config.read_text())
    if not any(name.endswith("ForSequenceClassification") for name in values.get("architectures") or []):
        return  # no classifier yet: the run adds one for these labels
    saved = [values["id2label"][key] for key in sorted(values.get("id2label") or {}, key=int)]
    names = task.label_names
    if same_names and (saved if task.problem_type != "regression" else []) != names:
        raise ConfigError(
            f"{what} {str(model_dir)!r} was trained for labels {saved}, but the data has labels {names}: use a new "
            "--output_dir for this data (or pass the checkpoint's data)"
        )
    count = len(saved) or values.get("num_labels", 2)  # transformers leaves out the default 2 labels
    if count != task.num_labels:
        needs = f"{len(names)} ({', '.join(names)})" if names else "1 (a regression value)"
        raise ConfigError(
            f"{what} {str(model_dir)!r} has a classifier for {count} labels, the data needs {needs}: "
            "pass --ignore_mismatched_sizes true to start a fresh head"
        )


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    parameters = list(model.parameters())
    return {"trainable_parameters": sum(p.numel() for p in parameters if p.requires_grad),
            "total_parameters": sum(p.numel() for p in parameters)}


def check_model_settings(model_args: ModelArguments, gradient_checkpointing: bool) -> None:
    """Check settings against the model's architecture, built from its config on the meta device: no
    weights are read (preflight.py, in one process)."""
    checks = [check_gradient_checkpointing] if gradient_checkpointing else []
    #% if cookiecutter.include_lora
    checks = lora.architecture_checks(model_args) + checks  # first --lora_target_modules, with --lora_r > 0
    #% endif
    if not checks:
        return
    config = from_pretrained(AutoConfig, model_args.model_name_or_path, **hub_options(model_args))
    from transformers import AutoModelForSequenceClassification

    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(
            config, trust_remote_code=model_args.trust_remote_code)
    for check in checks:
        check(model)


def check_gradient_checkpointing(model: PreTrainedModel) -> None:
    if not model.supports_gradient_checkpointing:
        raise ConfigError(f"--gradient_checkpointing: transformers' {type(model).__name__} does not support "
                          "it; leave it out")
