"""How the native loop spreads the model over the processes: DistributedDataParallel (DDP). train.py calls
only this module (as torchtitan's trainer its parallelize_fn): it wraps the model and says how to step, sync
and save. DDP keeps the whole model on every rank and averages the gradients during backward."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.nn.parallel import DistributedDataParallel

from .distributed import assert_gradients_synchronised
from .torchrun import TorchrunEnv

if TYPE_CHECKING:  # training_args imports this module, for ParallelArguments
    from .training_args import TrainingArguments

# torch 2.13 renamed DDP's broadcast_buffers; the project supports older versions too.
SYNC_BUFFERS = next(name for name in ("forward_sync_buffers", "broadcast_buffers")
                    if name in inspect.signature(DistributedDataParallel).parameters)


@dataclass
class ParallelArguments:
    """No flags of its own: DDP's settings are TrainingArguments' --ddp_* flags, as in transformers."""

    def check_parallel_settings(self) -> None:
        """DDP takes any of its settings: nothing to refuse."""


def parallelize(module: torch.nn.Module, args: TrainingArguments, env: TorchrunEnv, device: torch.device,
                precision: str) -> torch.nn.Module:
    """What the loop calls: the module in DDP when there are several processes, else the module itself."""
    if env.world_size == 1:
        return module
    # DDP all-reduces the gradients of the trainable parameters only.
    return DistributedDataParallel(
        module,  # its constructor broadcasts rank 0's weights, so every rank starts identical
        device_ids=[env.local_rank] if device.type == "cuda" else None,
        find_unused_parameters=args.ddp_find_unused_parameters,
        bucket_cap_mb=args.ddp_bucket_cap_mb,
        # Buffers such as position ids never change here: syncing them wastes a collective per micro-step.
        **{SYNC_BUFFERS: args.ddp_broadcast_buffers},
        # Gradients live in the all-reduce buckets, with no copy between the two; train() zeroes
        # them in place, which keeps that aliasing (set to None they would be re-made every step).
        gradient_as_bucket_view=True,
    )


def grad_scaler(model: torch.nn.Module, precision: str) -> torch.amp.GradScaler | None:
    return torch.amp.GradScaler("cuda") if precision == "fp16" else None


def autocast_precision(model: torch.nn.Module, precision: str) -> str:
    """The precision the forward runs in under autocast: the run's."""
    return precision


def gradient_sync(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Around one micro-step's forward and backward: DDP's all-reduce, off (no_sync) but on the last."""
    if isinstance(model, DistributedDataParallel) and not last:
        return model.no_sync()
    return contextlib.nullcontext()


def check_gradients(module: torch.nn.Module) -> None:
    """After the first step's backward: every rank holds the same averaged gradients."""
    assert_gradients_synchronised(module)


def whole_weights(module: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Around evaluation and predict, whose ranks may run different numbers of batches: every rank holds the
    whole weights already, and the module's forward communicates nothing."""
    return contextlib.nullcontext()


def final_weights(module: torch.nn.Module) -> None:
    """The state_dict the final save_pretrained writes: None, the module's own (every rank holds it whole)."""
    return None
