"""--fsdp: the model sharded over the ranks with FSDP2 (torch.distributed.fsdp.fully_shard).

DDP keeps whole weights, gradients and AdamW's moments on every rank; FSDP2 keeps 1/world_size of each,
as DTensor shards: gradients arrive averaged and sharded (a reduce-scatter), and AdamW steps the shards.
Here: wrapping, the gradient check, and the final weights gathered once. Shared with the Trainer's
--fsdp: the blocks (modeling.transformer_blocks) and whole weights (distributed.whole_weights).
"""

from __future__ import annotations

import logging

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

#% if cookiecutter.include_lora
from . import lora
#% endif
from .distributed import gathered_on_rank0
from .modeling import transformer_blocks

logger = logging.getLogger(__name__)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": None}


def shard_model(model: torch.nn.Module, device: torch.device, world_size: int, precision: str) -> torch.nn.Module:
    """fully_shard each transformer block, then the root (so that one block at a time is gathered whole),
    over all ranks; returns the model, sharded in place.

    Mixed precision is FSDP's own: each block is gathered and computes in bf16 or fp16 (param_dtype), its
    gradients are reduced in fp32 (reduce_dtype), and the shards AdamW steps stay fp32. autocast is not
    used on top (train.py), as torchtitan does. Each rank keeps its slice of its own copy, where DDP
    broadcasts rank 0's: the copies must be equal, as build_job makes them (the same seed everywhere).
    """
    mesh = init_device_mesh(device.type, (world_size,))  # explicit: CPU (gloo) too, not CUDA only
    policy = MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)
    blocks = transformer_blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    logger.info("FSDP: %d %s blocks and the root sharded over %d ranks, computing in %s", len(blocks),
                type(blocks[0]).__name__, world_size, DTYPES[precision] or torch.float32)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def assert_shards_reduced(model: torch.nn.Module) -> None:
    """After the first step: every trainable shard holds its gradient, or its rank would step on nothing.
    (Shards differ between ranks by design: they are not compared as DDP's whole gradients are.)"""
    missing = [name for name, p in model.named_parameters()
               if isinstance(p, DTensor) and p.requires_grad and p.grad is None]
    if missing:
        raise RuntimeError(f"FSDP reduced no gradient into {len(missing)} trainable parameter(s) after the "
                           f"first step ({', '.join(missing[:3])}): either the forward never uses them, or "
                           "gradient sync was left off on the last micro-step")


def gather_final_weights(model: torch.nn.Module) -> dict:
    """What the final save_pretrained writes, whole on rank 0 ({} elsewhere): the model's state_dict. Every
    rank calls it."""
    state = model.state_dict()
    #% if cookiecutter.include_lora
    if lora.is_lora(model):  # its trainable tensors, all that peft saves; lora.save_base gathers the base
        trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
        state = {name: tensor for name, tensor in state.items() if name in trainable}
    #% endif
    return gathered_on_rank0(state)
