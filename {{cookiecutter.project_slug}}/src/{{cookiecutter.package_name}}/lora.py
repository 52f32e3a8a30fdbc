"""LoRA through peft: its flags, the wrapped model, its checkpoints and the base saved beside the adapter.

--lora_r > 0 freezes the model, adds rank-r adapters to the linear layers of its body and trains the head
in full. The rest of the package calls in here where LoRA changes what it does: config.parse_args reads
LoraArguments, modeling.load_model calls apply_adapters (its freeze_unused then also freezes adapters on
layers the forward never uses, such as BigBird's pooler), the preflight and the loops refuse to resume a
checkpoint of another rank, and the final save writes the frozen base beside the adapter. A checkpoint
holds the adapters and the head only (adapter_config.json, no config.json), not the frozen base.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .config import ConfigError, ModelArguments, flag

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ADAPTER_CONFIG = "adapter_config.json"  # peft's: a folder holding it holds a LoRA adapter
logger = logging.getLogger(__name__)


@dataclass
class LoraArguments(ModelArguments):
    """The model's flags and LoRA's: config.parse_args reads these in ModelArguments' place."""

    lora_r: int = flag(0, "LoRA rank; 0: train every weight.")
    lora_alpha: float = flag(16, "LoRA scale: updates times alpha / r.")
    lora_dropout: float = flag(0.05, "Dropout on the LoRA inputs.")
    lora_target_modules: str = flag("all-linear", "Layers to adapt, or all-linear.")

    def __post_init__(self) -> None:
        if self.lora_r < 0:
            raise ConfigError(f"--lora_r {self.lora_r}: must be >= 0 (0 trains every weight, without LoRA)")
        if self.lora_alpha <= 0:
            raise ConfigError(f"--lora_alpha {self.lora_alpha}: must be > 0")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"--lora_dropout {self.lora_dropout}: must be from 0 up to (not including) 1")
        if not self.lora_target_modules.replace(",", "").strip():
            raise ConfigError("--lora_target_modules is empty: pass all-linear or layer names such as q_proj,v_proj")


def apply_adapters(model: PreTrainedModel, model_args: ModelArguments) -> torch.nn.Module:
    """The model in LoRA adapters where --lora_r > 0, else the model as it is (also for ModelArguments
    without LoRA's flags, as the tests build them)."""
    if not isinstance(model_args, LoraArguments) or model_args.lora_r == 0:
        return model
    logger.info("LoRA r=%d on %s: the body frozen, the head trained in full", model_args.lora_r,
                model_args.lora_target_modules)
    return wrap_with_lora(model, model_args)


def head_modules(model: PreTrainedModel) -> list[str]:
    """The classifier head: the model's top-level modules with weights, other than the pretrained body
    (e.g. classifier; score; pre_classifier and classifier; pooler and classifier)."""
    return [name for name, module in model.named_children()
            if name != model.base_model_prefix and any(True for _ in module.parameters())]


def lora_targets(model: PreTrainedModel, target_modules: str) -> list[str]:
    """The full names of the body's linear layers that get adapters: every one for "all-linear", else
    those whose own name is in the comma-separated list (e.g. q_proj,v_proj). The head is never one."""
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    body = model.base_model_prefix
    linear = {f"{body}.{name}": name.rpartition(".")[2] for name, module in model.get_submodule(body).named_modules()
              if isinstance(module, (torch.nn.Linear, Conv1D))}
    if not linear:
        raise ConfigError(f"--lora_r: {model.config.model_type} has no linear layers to add LoRA adapters "
                          "to; pass --lora_r 0")
    if target_modules == "all-linear":
        return sorted(linear)
    wanted = {name.strip() for name in target_modules.split(",") if name.strip()}
    unknown = sorted(wanted - set(linear.values()))
    if unknown:
        raise ConfigError(f"--lora_target_modules {target_modules}: {model.config.model_type} has no linear "
                          f"layer named {', '.join(unknown)}; its linear layers are named "
                          f"{', '.join(sorted(set(linear.values())))} (or pass all-linear)")
    return sorted(full for full, own in linear.items() if own in wanted)


def architecture_checks(model_args: ModelArguments) -> list[Callable[[PreTrainedModel], object]]:
    """What the preflight checks against the model's architecture (modeling.check_model_settings): that
    --lora_target_modules names linear layers it has."""
    if not isinstance(model_args, LoraArguments) or model_args.lora_r == 0:
        return []
    return [partial(lora_targets, target_modules=model_args.lora_target_modules)]


def wrap_with_lora(model: PreTrainedModel, model_args: LoraArguments) -> torch.nn.Module:
    """Freeze the model, add trainable low-rank adapters to its body's linear layers and train its head in
    full (peft's modules_to_save: a trainable copy, saved with the adapter)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers.pytorch_utils import Conv1D

    targets = lora_targets(model, model_args.lora_target_modules)
    lora_config = LoraConfig(
        task_type=TaskType.SEQ_CLS, r=model_args.lora_r, lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout, target_modules=targets, modules_to_save=head_modules(model),
        # GPT-2's linear layers are Conv1D, which store their weight transposed.
        fan_in_fan_out=isinstance(model.get_submodule(targets[0]), Conv1D),
    )
    with quiet_peft():
        return get_peft_model(model, lora_config)


@contextlib.contextmanager
def quiet_peft() -> Iterator[None]:
    """Without the FutureWarning peft 0.21 triggers on every rank: it reads transformers' old name for
    is_activation_checkpointing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        yield


def is_lora(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def rank_of(model: torch.nn.Module) -> int:
    return model.peft_config["default"].r if is_lora(model) else 0


def classifier_of(model: torch.nn.Module) -> PreTrainedModel:
    """The transformers model itself, also inside peft's wrapper."""
    return model.get_base_model() if is_lora(model) else model


def check_same_rank(checkpoint: Path, lora_r: int) -> None:
    """Refuse to resume a LoRA checkpoint (adapters only) without LoRA or at another rank, or the reverse."""
    adapter_config = checkpoint / ADAPTER_CONFIG
    saved_r = json.loads(adapter_config.read_text())["r"] if adapter_config.is_file() else 0
    if saved_r != lora_r:
        raise ConfigError(f"checkpoint {str(checkpoint)!r} was trained with --lora_r {saved_r}, this run has "
                          f"--lora_r {lora_r}: pass --lora_r {saved_r} to resume it, or use a new --output_dir")


def save_base(model: torch.nn.Module, folder: str | Path, is_main_process: bool) -> None:
    """Beside a LoRA model's adapter, write its frozen body and untrained head, with the config, so that
    AutoModelForSequenceClassification, pipeline and predict.py load the folder whole. No-op without LoRA.
    Every rank calls it; the main process writes."""
    if not is_lora(model):
        return
    from peft import get_base_model_state_dict

    base_weights = get_base_model_state_dict(model)
    #% if cookiecutter.include_fsdp
    from torch.distributed.fsdp import FSDPModule

    from .distributed import gathered_on_rank0

    if isinstance(model, FSDPModule):  # sharded: the base gathered whole on rank 0
        base_weights = gathered_on_rank0(base_weights)
    #% endif
    if is_main_process:
        model.get_base_model().save_pretrained(folder, state_dict=base_weights)


def refuse_adapter_without_base(path: str) -> None:
    """predict.py: a LoRA run's checkpoint-N holds the adapter only; its output_dir loads whole, as
    transformers finds the adapter beside the base (save_base)."""
    if Path(path, ADAPTER_CONFIG).is_file() and not Path(path, "config.json").is_file():
        raise ConfigError(f"--model_name_or_path {path!r} holds a LoRA adapter without its base (a checkpoint of a "
                          "--lora_r run): predict from the run's output_dir, which holds both")
