"""This process's device and precision, chosen from the flags and the GPU."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from .config import ConfigError
from .torchrun import TorchrunEnv


@dataclass(frozen=True)
class DeviceSettings:
    use_cpu: bool
    ddp_backend: str | None
    precision: str  # "bf16", "fp16" or "no"


def resolve_device_settings(mixed_precision: str, *, fp16: bool = False, bf16: bool = False,
                            use_cpu: bool = False, ddp_backend: str | None = None,
                            cuda_available: bool | None = None,
                            bf16_supported: bool | None = None) -> DeviceSettings:
    """Choose device, DDP backend and precision; refuse the combinations that silently misbehave. Only
    queries the GPU (LOCAL_RANK's, unpinned), so that argument parsing and the preflight run anywhere."""
    if fp16 and bf16:
        raise ConfigError("--fp16 and --bf16 are both set; pick one (or use --mixed_precision)")
    explicit = "fp16" if fp16 else "bf16" if bf16 else None
    if explicit and mixed_precision not in ("auto", explicit):
        raise ConfigError(f"--{explicit} contradicts --mixed_precision {mixed_precision}; "
                          "pass only one of them")

    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    on_gpu = cuda_available and not use_cpu

    precision = explicit or mixed_precision
    if on_gpu and precision in ("auto", "bf16"):
        if bf16_supported is None:
            # Not torch.cuda.is_bf16_supported(): it reads the current device (GPU 0 until a rank pins its
            # own) and counts emulation (V100 and T4 "support" bf16, slowly). Every ROCm GPU computes in bf16.
            local_rank = TorchrunEnv.read().local_rank
            bf16_supported = bool(torch.version.hip) or torch.cuda.get_device_capability(local_rank) >= (8, 0)
        if precision == "bf16" and not bf16_supported:
            raise ConfigError("--mixed_precision bf16: this GPU has no native bf16 (V100 and T4 only emulate "
                              "it, slowly); use --mixed_precision fp16 or auto")
        precision = "bf16" if bf16_supported else "fp16"
    if precision == "auto":  # on CPU
        precision = "no"
    if precision == "fp16" and not on_gpu:
        raise ConfigError("--mixed_precision fp16 needs a CUDA GPU: on CPU it would silently run in fp32; "
                          "use --mixed_precision no (or bf16)")
    if ddp_backend == "nccl" and not on_gpu:
        raise ConfigError("--ddp_backend nccl needs CUDA GPUs (and no --use_cpu): use gloo or leave it unset")
    if ddp_backend is None and TorchrunEnv.read().world_size > 1:
        ddp_backend = "nccl" if on_gpu else "gloo"
    return DeviceSettings(use_cpu=not on_gpu, ddp_backend=ddp_backend, precision=precision)


def training_device_settings(args: Any) -> DeviceSettings:
    """resolve_device_settings from a training run's flags (either loop's TrainingArguments)."""
    return resolve_device_settings(args.mixed_precision, fp16=args.fp16, bf16=args.bf16, use_cpu=args.use_cpu,
                                   ddp_backend=args.ddp_backend)


def autocast(device: torch.device, precision: str) -> torch.autocast:
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def select_device(use_cpu: bool, several_gpus: str = "refuse") -> torch.device:
    """This rank's device, pinned as the current CUDA device before anything else touches CUDA: NCCL binds
    to it (unpinned, every rank would use GPU 0). Several GPUs in one process without torchrun: training
    refuses ("refuse"), as the Trainer would wrap the model in DataParallel and the native loop use GPU 0
    alone; predict takes the first."""
    if use_cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    count, launch = torch.cuda.device_count(), TorchrunEnv.read()
    if not launch.started and count > 1:
        if several_gpus == "refuse":
            raise ConfigError(f"{count} GPUs are visible to one process: start one process per GPU with "
                              "scripts/train_single_node.sh (torchrun), or set CUDA_VISIBLE_DEVICES=0")
        logging.getLogger(__package__).info("%d GPUs are visible to this one process: it uses cuda:0 alone",
                                            count)
    torch.cuda.set_device(launch.local_rank)
    return torch.device("cuda", launch.local_rank)
