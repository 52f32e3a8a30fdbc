"""How the Trainer spreads the model over the processes: DDP, which accelerate wraps the model in. train.py
calls only this module (as torchtitan's trainer its parallelize_fn), and training_args.TrainingArguments
takes its flags' checks from it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import TrainerCallback

from .config import ConfigError
from .distributed import assert_gradients_synchronised

if TYPE_CHECKING:  # training_args imports this module
    from .training_args import TrainingArguments


@dataclass
class ParallelArguments:
    """No flags of its own: DDP's settings are transformers' --ddp_* flags."""

    def check_parallel_settings(self) -> None:
        """transformers' --fsdp and --fsdp_config would have accelerate shard the model instead: this project
        trains with DDP alone, so they are refused, in one line, rather than half set up."""
        for name in ("fsdp", "fsdp_config"):
            if getattr(self, name):
                raise ConfigError(f"--{name} {getattr(self, name)}: this project was generated to train "
                                  "with DDP alone (include_fsdp no); drop the flag, or generate it again "
                                  "with include_fsdp yes")


def check_parallel_setup(args: TrainingArguments) -> None:
    """Once the run is set up (train.prepare_run): DDP runs wherever torchrun started the processes, which
    train.check_really_distributed checks. Nothing to add."""


def parallelize(model: torch.nn.Module, args: TrainingArguments) -> TrainerCallback:
    """The model needs nothing before the Trainer wraps it; the callback proves the ranks in step."""
    return GradientSyncCheck()


class GradientSyncCheck(TrainerCallback):
    """Before the first optimizer step, prove every rank holds the same averaged gradients."""

    def __init__(self) -> None:
        self.checked = False

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.checked:
            assert_gradients_synchronised(model)
            self.checked = True


def whole_weights(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Around predict, whose ranks may run different numbers of batches: every rank holds the whole weights
    already, and the model's forward communicates nothing."""
    return contextlib.nullcontext()
