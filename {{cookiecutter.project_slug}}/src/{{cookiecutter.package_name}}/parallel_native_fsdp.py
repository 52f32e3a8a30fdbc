"""How the native loop runs one model on many processes: DistributedDataParallel (DDP) by default, or with
--fsdp the model sharded over the ranks by FSDP2 (torch.distributed.fsdp.fully_shard).

DDP keeps the whole model on every process: each rank computes the gradients of its own batch, DDP
averages them over the ranks with all-reduces during backward, and every rank steps its own copy with the
same averaged gradients, so the copies stay identical. FSDP2 keeps 1/world_size of the weights, gradients
and AdamW's moments on each, as DTensor shards: each transformer block is gathered whole for its forward
and backward, gradients arrive averaged and sharded (a reduce-scatter), and AdamW steps the shards.

train.py calls only what this module defines, never DDP or FSDP itself (as torchtitan's trainer calls its
parallelize_fn): `parallelize` wraps or shards the model; at each step `autocast_precision`, `grad_scaler`
and `gradient_sync` say how to compute and when to sync; `check_gradients` proves the ranks in step after
the first; `whole_weights` and `final_weights` give evaluation, predict and the final save their weights.
`ParallelArguments` is what training_args.TrainingArguments takes from here: --fsdp.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from .config import ConfigError, flag
from .distributed import assert_gradients_synchronised
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
        """Under --fsdp, refuse rather than silently ignore DDP's own settings; and a torch whose FSDP2 trains
        otherwise."""
        if not self.fsdp:
            return
        for name in ("ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers"):
            value, default = getattr(self, name), type(self).__dataclass_fields__[name].default
            if value != default:
                raise ConfigError(f"--{name} {value} is a DDP setting, which --fsdp does not use; "
                                  f"leave it at {default} or train without --fsdp")
        if torch.__version__ < FSDP_SINCE:
            raise ConfigError(f"--fsdp needs torch {FSDP_SINCE} or newer (this is {torch.__version__}, on which "
                              "FSDP2 trains to other weights); upgrade torch or train without --fsdp")


def parallelize(module: torch.nn.Module, args: TrainingArguments, env: TorchrunEnv, device: torch.device,
                precision: str) -> torch.nn.Module:
    """What the loop calls: with --fsdp on several processes the module, sharded in place; else the module in
    DDP when there are several processes, else the module itself."""
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
    # DDP all-reduces the gradients of the parameters that require one: under LoRA, the adapters' and head's.
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
    """fully_shard each transformer block, then the root (so that one block at a time is gathered whole),
    over all ranks; returns the model, sharded in place.

    Mixed precision is FSDP's own: each block is gathered and computes in bf16 or fp16 (param_dtype), its
    gradients are reduced in fp32 (reduce_dtype), and the shards AdamW steps stay fp32. autocast is not
    used on top (autocast_precision), as torchtitan does. Each rank keeps its slice of its own copy, where
    DDP broadcasts rank 0's: the copies must be equal, as train.build_job makes them (the same seed
    everywhere).
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
        from .modeling import classifier_of  # here: training_args imports this module, and needs no model code

        name = type(classifier_of(model)).__name__
        raise ConfigError(f"--fsdp: found no list of repeated transformer blocks in {name} to shard one by "
                          "one; train it without --fsdp")
    return max(lists, key=lambda blocks: sum(p.numel() for p in blocks.parameters()))


def is_sharded(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def grad_scaler(model: torch.nn.Module, precision: str) -> torch.amp.GradScaler | None:
    """fp16 only: loss scaling keeps small gradients from flushing to zero. Under FSDP a rank sees its
    shards' overflow alone: ShardedGradScaler agrees on it over the ranks."""
    if precision != "fp16":
        return None
    return ShardedGradScaler("cuda") if is_sharded(model) else torch.amp.GradScaler("cuda")


def autocast_precision(model: torch.nn.Module, precision: str) -> str:
    """The precision the forward runs in under autocast: the run's, but none under FSDP, whose
    MixedPrecisionPolicy casts instead (shard_model)."""
    return "no" if is_sharded(model) else precision


def gradient_sync(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager:
    """Around one micro-step's forward and backward. DDP all-reduces gradients during backward (FSDP
    reduce-scatters them); between micro-steps that is wasted traffic, so it is off but on the last, whose
    backward averages the accumulated sum."""
    if is_sharded(model):
        model.set_requires_gradient_sync(last)
    elif isinstance(model, DistributedDataParallel) and not last:
        return model.no_sync()
    return contextlib.nullcontext()


def check_gradients(module: torch.nn.Module) -> None:
    """After the first step's backward: under DDP every rank holds the same averaged gradients; under FSDP,
    whose shards differ between ranks by design, every trainable shard holds its reduced gradient."""
    if is_sharded(module):
        assert_shards_reduced(module)
    else:
        assert_gradients_synchronised(module)


def assert_shards_reduced(model: torch.nn.Module) -> None:
    """After the first step: every trainable shard holds its gradient, or its rank would step on nothing."""
    missing = [name for name, p in model.named_parameters()
               if isinstance(p, DTensor) and p.requires_grad and p.grad is None]
    if missing:
        raise RuntimeError(f"FSDP reduced no gradient into {len(missing)} trainable parameter(s) after the "
                           f"first step ({', '.join(missing[:3])}): either the forward never uses them, or "
                           "gradient sync was left off on the last micro-step")


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """Around evaluation and predict, whose ranks may run different numbers of batches: inside, every rank
    holds FSDP's whole weights and a forward communicates nothing. Outside, the weights are sharded again.
    (Under DDP every rank holds them whole already.)"""
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


def final_weights(module: torch.nn.Module) -> tuple[dict | None, dict | None]:
    """The state_dicts the final save_pretrained writes, the model's and with LoRA its base's
    (modeling.save_lora_base): under DDP None, None, for the module's own. Under FSDP, gathered whole on
    rank 0 ({} elsewhere): with LoRA its trainable tensors (all that peft's save_pretrained keeps) and the
    base's, so that no weight is gathered twice. Every rank calls it."""
    if not is_sharded(module):
        return None, None
    from .modeling import is_lora  # here: training_args imports this module, and needs no model code

    state = module.state_dict()
    if not is_lora(module):
        return gathered_on_rank0(state), None
    from peft import get_base_model_state_dict

    trainable = {name for name, parameter in module.named_parameters() if parameter.requires_grad}
    adapters = gathered_on_rank0({name: tensor for name, tensor in state.items() if name in trainable})
    return adapters, gathered_on_rank0(get_base_model_state_dict(module))


def gathered_on_rank0(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state_dict's tensors whole, in fp32 as trained, on rank 0's CPU ({} elsewhere), one at a time on
    the device. Every rank calls it."""
    rank, whole = dist.get_rank(), {}
    for name, tensor in state.items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if rank == 0:
            whole[name] = tensor.detach().cpu()
    return whole
