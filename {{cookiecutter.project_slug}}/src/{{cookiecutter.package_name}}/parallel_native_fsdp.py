"""How the native loop spreads the model over the processes: DDP, or with --fsdp FSDP2 (fully_shard). train.py
calls only this module (as torchtitan's trainer its parallelize_fn): it wraps the model, says how to step,
sync and save, and adds --fsdp to training_args.TrainingArguments.

DDP keeps whole weights, gradients and AdamW's moments on every rank; FSDP2 keeps 1/world_size of each, as
DTensor shards: gradients arrive averaged and sharded (a reduce-scatter), and AdamW steps the shards.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

#% if cookiecutter.include_lora
from . import lora
#% endif
from .config import ConfigError, flag
from .distributed import assert_gradients_synchronised, gathered_on_rank0
from .torchrun import TorchrunEnv

if TYPE_CHECKING:  # training_args imports this module, for ParallelArguments
    from .training_args import TrainingArguments

logger = logging.getLogger(__name__)
# The first torch on which FSDP2 here trains to DDP's weights and resumes on another world size to the same
# weights (2.8: other gradients on CPU; 2.9: other weights after such a resume).
FSDP_SINCE = "2.10"
# torch 2.13 renamed DDP's broadcast_buffers; the project supports older versions too.
SYNC_BUFFERS = next(name for name in ("forward_sync_buffers", "broadcast_buffers")
                    if name in inspect.signature(DistributedDataParallel).parameters)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "no": None}


@dataclass
class ParallelArguments:
    # transformers takes a string of FSDP options; here true shards each transformer block (shard_model).
    fsdp: bool = flag(False, "Shard weights, grads, AdamW (FSDP2).")

    def check_parallel_settings(self) -> None:
        """Refuse, rather than ignore, DDP's own settings; and a torch whose FSDP2 trains otherwise."""
        if not self.fsdp:
            return
        for name in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers"):
            value, default = getattr(self, name), type(self).__dataclass_fields__[name].default
            if value != default:
                raise ConfigError(f"--{name} {value} is a DDP setting, which --fsdp does not use; "
                                  f"leave it at {default} or train without --fsdp")
        if torch.__version__ < FSDP_SINCE:
            raise ConfigError(f"--fsdp needs torch {FSDP_SINCE} or newer (this is {torch.__version__}, on "
                              "which FSDP2 trains to other weights); upgrade torch or train without --fsdp")


def parallelize(module: torch.nn.Module, args: TrainingArguments, env: TorchrunEnv, device: torch.device,
                precision: str) -> torch.nn.Module:
    """What the loop calls: the module sharded in place (--fsdp), in DDP, or itself on one process."""
    if args.fsdp and env.world_size > 1:
        return shard_model(module, device, env.world_size, precision)
    if args.fsdp:  # the same config on one GPU, to debug: refused or accepted as on many
        transformer_blocks(module)
        logger.info("--fsdp on one process: nothing to shard, the model trains whole")
    return wrap_in_ddp(module, args, env, device)


def wrap_in_ddp(module: torch.nn.Module, args: TrainingArguments, env: TorchrunEnv,
                device: torch.device) -> torch.nn.Module:
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


def shard_model(model: torch.nn.Module, device: torch.device, world_size: int, precision: str) -> torch.nn.Module:
    """fully_shard each transformer block, then the root: one block at a time is gathered whole.

    Mixed precision is FSDP's own: each block is gathered and computes in bf16 or fp16 (param_dtype), its
    gradients are reduced in fp32 (reduce_dtype), and the shards AdamW steps stay fp32. autocast is not
    used on top (autocast_precision), as torchtitan does. Each rank keeps its slice of its own copy, where
    DDP broadcasts rank 0's: the copies are equal, as build_job seeds every rank alike.
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


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The repeated blocks FSDP shards one by one: the ModuleList of one class holding the most weights
    (BERT's encoder.layer, GPT-2's h, Llama's layers). transformers' _no_split_modules names them for some
    families only (DistilBERT, ELECTRA and DeBERTa-v2 leave it empty)."""
    lists = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList)
             and len({type(block) for block in module}) == 1 and any(True for _ in module.parameters())]
    if not lists:
        #% if cookiecutter.include_lora
        model = lora.classifier_of(model)  # its own class's name, not peft's wrapper's
        #% endif
        raise ConfigError(f"--fsdp: found no list of repeated transformer blocks in {type(model).__name__} to "
                          "shard one by one; train it without --fsdp")
    return max(lists, key=lambda blocks: sum(p.numel() for p in blocks.parameters()))


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def grad_scaler(model: torch.nn.Module, precision: str) -> torch.amp.GradScaler | None:
    """fp16 only. Under FSDP a rank sees its shards' overflow alone: ShardedGradScaler agrees on it."""
    if precision != "fp16":
        return None
    return ShardedGradScaler("cuda") if is_sharded(model) else torch.amp.GradScaler("cuda")


def autocast_precision(model: torch.nn.Module, precision: str) -> str:
    return "no" if is_sharded(model) else precision  # FSDP's MixedPrecisionPolicy casts instead


def gradient_sync(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Around a micro-step: DDP all-reduces (FSDP reduce-scatters) in the last one's backward only."""
    if is_sharded(model):
        model.set_requires_gradient_sync(last)
    ddp = isinstance(model, DistributedDataParallel)
    return model.no_sync() if ddp and not last else contextlib.nullcontext()


def check_gradients(module: torch.nn.Module) -> None:
    """After the first step: DDP's gradients equal on every rank; FSDP's, shards that differ by design, each
    reduced, or its rank would step on nothing."""
    if not is_sharded(module):
        return assert_gradients_synchronised(module)
    missing = [name for name, p in module.named_parameters()
               if isinstance(p, DTensor) and p.requires_grad and p.grad is None]
    if missing:
        raise RuntimeError(f"FSDP reduced no gradient into {len(missing)} trainable parameter(s) after the "
                           f"first step ({', '.join(missing[:3])}): either the forward never uses them, or "
                           "gradient sync was left off on the last micro-step")


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every rank holds FSDP's whole weights and a forward communicates nothing, so ranks may run
    different numbers of evaluation batches. Outside, the weights are sharded again."""
    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            module.reshard()
            # fully_shard's defaults: blocks reshard after forward, the root keeps its weights until backward.
            module.set_reshard_after_forward(module is not model, recurse=False)


def final_weights(module: torch.nn.Module) -> dict | None:
    """The state_dict the final save_pretrained writes: None (the module's own), or under FSDP its tensors
    gathered whole on rank 0 ({} elsewhere). Every rank calls it."""
    if not is_sharded(module):
        return None
    state = module.state_dict()
    #% if cookiecutter.include_lora
    if lora.is_lora(module):  # its trainable tensors, all that peft saves; lora.save_base gathers the base
        trainable = {name for name, parameter in module.named_parameters() if parameter.requires_grad}
        state = {name: tensor for name, tensor in state.items() if name in trainable}
    #% endif
    return gathered_on_rank0(state)
