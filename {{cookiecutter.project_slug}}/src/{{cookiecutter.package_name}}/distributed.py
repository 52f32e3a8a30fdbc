"""Rank, device, backend, precision and barriers: everything that differs between processes."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DeviceSettings:
    use_cpu: bool
    ddp_backend: str | None
    precision: str  # "bf16", "fp16" or "no"


def resolve_device_settings(
    mixed_precision: str,
    *,
    fp16: bool = False,
    bf16: bool = False,
    use_cpu: bool = False,
    ddp_backend: str | None = None,
    cuda_available: bool | None = None,
    bf16_supported: bool | None = None,
) -> DeviceSettings:
    """Choose device, DDP backend and precision; refuse the combinations that silently misbehave.

    `--fp16`/`--bf16` given directly win over `--mixed_precision auto`. fp16 on CPU is refused:
    there it silently runs in fp32.
    """
    if mixed_precision not in ("auto", "bf16", "fp16", "no"):
        raise ValueError(f"--mixed_precision {mixed_precision!r}: use auto, bf16, fp16 or no")
    if fp16 and bf16:
        raise ValueError("--fp16 and --bf16 are both set; pick one (or use --mixed_precision)")
    explicit = "fp16" if fp16 else "bf16" if bf16 else None
    if explicit and mixed_precision not in ("auto", explicit):
        raise ValueError(f"--{explicit} contradicts --mixed_precision {mixed_precision}; pass only one of them")

    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    on_gpu = cuda_available and not use_cpu

    precision = explicit or mixed_precision
    if precision == "auto":
        if not on_gpu:
            precision = "no"
        else:
            if bf16_supported is None:
                # Without emulation: V100 and T4 "support" bf16 only by emulating it, slowly.
                bf16_supported = torch.cuda.is_bf16_supported(including_emulation=False)
            precision = "bf16" if bf16_supported else "fp16"
    if precision == "fp16" and not on_gpu:
        raise ValueError(
            "--mixed_precision fp16 needs a CUDA GPU: on CPU it would silently run in fp32; "
            "use --mixed_precision no (or bf16)"
        )
    if ddp_backend is None and env_world_size() > 1:
        ddp_backend = "nccl" if on_gpu else "gloo"
    return DeviceSettings(use_cpu=not on_gpu, ddp_backend=ddp_backend, precision=precision)


def env_world_size() -> int:
    """The world size torchrun announced; 1 for a plain `python -m` run."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_really_distributed(world_size_in_use: int) -> None:
    """Fail loudly when torchrun started several processes but each would train alone."""
    expected = env_world_size()
    group_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if expected > 1 and (group_size != expected or world_size_in_use != expected):
        raise RuntimeError(
            f"WORLD_SIZE={expected} but this process would train with world size {world_size_in_use} "
            f"(process group size {group_size}): the ranks would not share gradients. "
            "On CPU pass --use_cpu true and --ddp_backend gloo; on GPU check that CUDA is visible to every rank."
        )


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def broadcast_from_main(value: object) -> object:
    """Rank 0's value on every rank, so that all ranks act on one decision."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


@contextlib.contextmanager
def main_process_first(local: bool = True) -> Iterator[None]:
    """Let rank 0 (of each node, by default) run the block first; the others then read its cache."""
    rank = int(os.environ.get("LOCAL_RANK" if local else "RANK", "0"))
    synchronised = dist.is_available() and dist.is_initialized()
    if synchronised and rank != 0:
        dist.barrier()
    try:
        yield
    finally:
        if synchronised and rank == 0:
            dist.barrier()


@torch.no_grad()
def assert_gradients_synchronised(model: torch.nn.Module) -> None:
    """Compare per-tensor gradient sums across ranks; they differ only if DDP is not syncing.

    Costs one all_gather, so call it once (after the first backward), not every step.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    sums = torch.stack([g.detach().double().sum() for g in grads])
    gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, sums)
    for rank, other in enumerate(gathered[1:], start=1):
        if not torch.allclose(gathered[0], other, rtol=1e-5, atol=1e-8, equal_nan=True):
            raise RuntimeError(
                f"gradients differ between rank 0 and rank {rank} after the first step: DDP is not "
                "synchronising them. Launch with torchrun and let this project pick the backend."
            )


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def setup_distributed(use_cpu: bool, backend: str | None, timeout_seconds: int) -> DistributedEnv:
    """Read torchrun's environment, pin the GPU, then start the process group (native loop)."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = env_world_size()
    if use_cpu:
        device = torch.device("cpu")
    else:
        # Before init_process_group, so NCCL binds this rank to its own GPU and not all to GPU 0.
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if world_size > 1:
        dist.init_process_group(
            backend=backend,
            timeout=timedelta(seconds=timeout_seconds),
            device_id=device if device.type == "cuda" else None,
        )
    return DistributedEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def cleanup_distributed() -> None:
    """Destroy the process group once nothing holds it any more.

    DDP keeps the group alive through reference cycles; freed only at interpreter exit, after the
    group, gloo's threads can abort the process ("terminate called without an active exception").
    Callers drop their DDP wrappers first; the collection here frees the cycles.
    """
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def setup_or_adopt_distributed(use_cpu: bool, backend: str | None, timeout_seconds: int) -> DistributedEnv:
    """setup_distributed, or take over the process group that parsing TrainingArguments started.

    Under torchrun, transformers' TrainingArguments.__post_init__ builds accelerate's PartialState,
    which calls init_process_group itself: with --ddp_backend, but on CPU without --ddp_timeout and
    on GPU before pinning the device. Adopt that group, after checking it spans torchrun's world,
    then pin the device and apply --ddp_timeout to it.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return setup_distributed(use_cpu, backend, timeout_seconds)
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = env_world_size()
    if (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
        raise RuntimeError(
            f"a process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, but torchrun "
            f"set RANK={rank} WORLD_SIZE={world_size}; start the run only through torchrun or the scripts/ launchers"
        )
    if use_cpu:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    set_process_group_timeout(timeout_seconds)
    return DistributedEnv(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def set_process_group_timeout(timeout_seconds: int) -> None:
    """Apply --ddp_timeout to a group that accelerate started (on CPU it passes no timeout)."""
    if dist.is_available() and dist.is_initialized():
        # No public setter exists; _set_pg_timeout is torch's own helper for exactly this.
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_seconds))
