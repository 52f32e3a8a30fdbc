"""--fsdp: the model sharded over the ranks with FSDP2 (torch.distributed.fsdp.fully_shard).

DDP keeps a whole copy of the weights, their gradients and AdamW's two moments on every rank. FSDP2
keeps 1/world_size of each: every transformer block is sharded on its own, then the root (embeddings,
head, the rest), so that one block at a time is gathered whole in the forward and backward passes.
Each parameter becomes a DTensor holding this rank's shard; its gradient arrives already averaged over
the ranks and sharded (a reduce-scatter), and AdamW steps the shards. The rest of the loop stays as
under DDP; this module holds what differs: wrapping, accumulation, the gradient check, evaluation on
whole weights, and gathering the weights once for the final save_pretrained.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from .config import ConfigError
from .modeling import classifier_of, is_lora

logger = logging.getLogger(__name__)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": None}


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's repeated blocks: the ModuleList of modules of one class that holds the most weights.

    Found from the model itself rather than from class names per family: BERT's encoder.layer, GPT-2's
    h, Llama's layers. (transformers' _no_split_modules names them for some families only: DistilBERT,
    ELECTRA and DeBERTa-v2 leave it empty.)
    """
    lists = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList) and len(module) > 0
             and len({type(block) for block in module}) == 1 and any(True for _ in module.parameters())]
    if not lists:
        name = type(classifier_of(model)).__name__
        raise ConfigError(f"--fsdp: found no list of repeated transformer blocks in {name} to shard one by one; "
                          "train it without --fsdp")
    return max(lists, key=lambda blocks: sum(p.numel() for p in blocks.parameters()))


def shard_model(model: torch.nn.Module, device: torch.device, world_size: int, precision: str) -> torch.nn.Module:
    """fully_shard each transformer block, then the root, over all ranks; returns the model, sharded in place.

    Mixed precision is FSDP's own: each block is gathered and computes in bf16 or fp16 (param_dtype), its
    gradients are reduced in fp32 (reduce_dtype), and the shards AdamW steps stay fp32. autocast is not
    used on top (train.py), as torchtitan does. Each rank keeps its slice of its own copy, where DDP
    broadcasts rank 0's: the copies must be equal, as build_job makes them (the same seed everywhere).
    """
    mesh = init_device_mesh(device.type, (world_size,))  # explicit: on CPU too (gloo), not the default CUDA one
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


@contextlib.contextmanager
def no_gradient_sync(model: FSDPModule) -> Iterator[None]:
    """FSDP's counterpart of DDP's no_sync(): the backward passes inside accumulate whole, unreduced
    gradients on each rank (memory of one whole gradient) and communicate nothing; the next backward
    outside reduce-scatters the sum."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def assert_shards_reduced(model: torch.nn.Module) -> None:
    """After the first step: every trainable shard holds its gradient. A shard without one was never
    reduce-scattered, and its rank would step on nothing. (The shards differ between ranks by design,
    so they are not compared across ranks as DDP's whole gradients are.)"""
    missing = [name for name, p in model.named_parameters()
               if isinstance(p, DTensor) and p.requires_grad and p.grad is None]
    if missing:
        raise RuntimeError(f"FSDP reduced no gradient into {len(missing)} trainable parameter(s) after the first "
                           f"step ({', '.join(missing[:3])}): either the forward never uses them, or gradient "
                           "sync was left off on the last micro-step")


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every rank holds the whole weights (in the compute dtype), and a forward pass communicates
    nothing: evaluation and prediction then run any number of batches on each rank, as without FSDP.
    Outside, the weights are sharded again. Without FSDP, nothing to do."""
    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            module.reshard()
            # fully_shard's defaults: the blocks reshard after forward, the root keeps its weights until backward.
            module.set_reshard_after_forward(module is not model, recurse=False)


def gathered_on_rank0(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a state_dict whole, in fp32 as trained, on rank 0's CPU; {} on the other ranks.
    One all-gather per sharded tensor, so one whole tensor at a time is on the device. Every rank calls it."""
    rank, whole = dist.get_rank(), {}
    for name, tensor in state.items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if rank == 0:
            whole[name] = tensor.detach().cpu()
    return whole


def gather_final_weights(model: torch.nn.Module) -> tuple[dict, dict | None]:
    """What the final save_pretrained writes, gathered once, whole on rank 0 ({} elsewhere): the model's
    state_dict; with LoRA, its trainable tensors (adapters and head, all that peft's save_pretrained keeps)
    and the base's (modeling.save_lora_base), so that no weight is gathered twice. Every rank calls it."""
    state = model.state_dict()
    if not is_lora(model):
        return gathered_on_rank0(state), None
    from peft import get_base_model_state_dict

    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    adapters = gathered_on_rank0({name: tensor for name, tensor in state.items() if name in trainable})
    return adapters, gathered_on_rank0(get_base_model_state_dict(model))
