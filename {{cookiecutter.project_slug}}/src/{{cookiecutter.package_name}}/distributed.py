"""Processes in step: the process group, logging per rank, rank 0 first, a forward over each rank's share of
the rows (every row once), the gradient check, and one error line per node."""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import datasets
import numpy as np
import torch
import torch.distributed as dist
import transformers

from .config import ConfigError
from .device import DeviceSettings, autocast, select_device
from .torchrun import TorchrunEnv


def start_distributed(settings: DeviceSettings, timeout_seconds: int,
                      several_gpus: str = "refuse") -> torch.device:
    """Pin this rank's device and join torchrun's group, logged first: a hang shows what it waited for."""
    device, world_size = select_device(settings.use_cpu, several_gpus), TorchrunEnv.read().world_size
    logging.getLogger(__package__).info("world size %d, device %s, backend %s, precision %s", world_size,
                                        device, settings.ddp_backend, settings.precision)
    if world_size > 1 and not dist.is_initialized():
        # device_id: NCCL sets up its communicator at once on this rank's GPU, instead of guessing lazily at
        # the first collective (and warning at every barrier).
        dist.init_process_group(backend=settings.ddp_backend, timeout=timedelta(seconds=timeout_seconds),
                                device_id=device if device.type == "cuda" else None)
    return device


def agree_on_precision(precision: str) -> None:
    """Refuse ranks that chose different precisions: their gradients would be averaged at different scales
    (fp16 with a GradScaler, bf16 without), which the gradient check, after the all-reduce, cannot see."""
    if not is_distributed():
        return
    chosen = [None] * dist.get_world_size()
    dist.all_gather_object(chosen, precision)
    if len(set(chosen)) > 1:
        ranks = ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(chosen))
        raise ConfigError(f"the ranks chose different precisions ({ranks}), as on a cluster mixing GPU "
                          "types; pass --mixed_precision fp16 (or no) so that every rank trains alike")


@contextlib.contextmanager
def exit_on_config_error() -> Iterator[None]:
    """The commands' one exit for a bad setting: an `error:` line per node (files can differ between nodes, so
    rank 0 alone could hide a node's own problem), then exit status 2. torchrun stops every process once one
    ends: the node's other processes wait a little, so that its first one has printed by then."""
    try:
        yield
    except ConfigError as err:
        launch = TorchrunEnv.read()
        if launch.local_rank == 0:
            print(f"error: {err}", file=sys.stderr)
        elif launch.world_size > 1:
            time.sleep(5)
        raise SystemExit(2) from None


def default_dataloader_workers() -> int:
    """Loader processes per rank: its share of the CPUs, less one for itself, at most 4 (a fixed 4
    oversubscribes small machines). The CPUs it may run on: SLURM's --cpus-per-task, a container's cpuset."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(4, cpus // TorchrunEnv.read().local_world_size - 1))


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def length_sorted_shard(lengths: list[int], rank: int, world_size: int) -> np.ndarray:
    """The rows `rank` runs through sharded_forward: every world_size-th row, longest first (a batch needs
    little padding).
    Not a DistributedSampler: it repeats rows to even out the ranks, which would count them twice."""
    return np.argsort(-np.asarray(lengths), kind="stable")[rank::world_size]


def gather_shards(indices: np.ndarray, total: int, *columns: np.ndarray) -> list[np.ndarray] | None:
    """On rank 0, each column with every rank's shard put back at its rows (`total` rows); None elsewhere.
    Every rank calls it."""
    shares = [(indices, columns)]
    if is_distributed():
        shares = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object((indices, columns), shares, dst=0)
        if dist.get_rank() != 0:
            return None
    gathered = []
    for column in range(len(columns)):
        first = shares[0][1][column]  # rank 0 holds row 0: its array has the column's shape and dtype
        whole = np.empty((total, *first.shape[1:]), dtype=first.dtype)
        for rows, values in shares:
            if len(rows):  # a rank may get no row at all when there are fewer rows than ranks
                whole[rows] = values[column]
        gathered.append(whole)
    return gathered


@torch.no_grad()
def sharded_forward(model: torch.nn.Module, rows: datasets.Dataset, batches: Callable, device: torch.device,
                    precision: str) -> tuple[np.ndarray, np.ndarray | None, float] | None:
    """A forward over every row exactly once, each rank on its length_sorted_shard (every rank calls it).
    Rank 0 returns every row's logits, with the labels and summed loss of labelled rows (else None and 0.0);
    the others None."""
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)
    model.eval()  # no dropout: the same row gives the same logits every time
    mine = length_sorted_shard(rows["length"], rank, world_size)
    labelled = "labels" in rows.column_names
    logits, labels, loss_sum = [], [], torch.zeros((), device=device)
    for batch in batches(rows.select(mine)):
        batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
        with autocast(device, precision):
            output = model(**batch)
        logits.append(output.logits.float().cpu())
        if labelled:
            loss_sum += output.loss.float() * len(batch["labels"])
            labels.append(batch["labels"].cpu())
    # A rank with no rows (fewer rows than ranks) sends empty arrays.
    columns = [torch.cat(logits).numpy() if logits else np.empty((0, model.config.num_labels), np.float32)]
    if labelled:
        columns.append(torch.cat(labels).numpy() if labels else np.empty(0))
        if is_distributed():
            dist.reduce(loss_sum, dst=0)
    gathered = gather_shards(mine, len(rows), *columns)
    if gathered is None:
        return None
    return gathered[0], gathered[1] if labelled else None, float(loss_sum)


#% if cookiecutter.include_fsdp and (cookiecutter.training_loop == "native" or cookiecutter.include_lora)
def gathered_on_rank0(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state_dict's tensors whole, in fp32 as trained, on rank 0's CPU ({} elsewhere), one at a time on
    the device. Every rank calls it."""
    from torch.distributed.tensor import DTensor  # here: only FSDP's runs gather

    rank, whole = dist.get_rank(), {}
    for name, tensor in state.items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        if rank == 0:
            whole[name] = tensor.detach().cpu()
    return whole


#% endif
def setup_logging(is_main_process: bool) -> None:
    """Progress from rank 0, warnings and errors from the others; of the libraries' progress bars only the
    data set's tokenising, on a terminal."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stdout)
    logging.getLogger(__package__).setLevel(logging.INFO if is_main_process else logging.WARNING)
    transformers.utils.logging.set_verbosity(logging.WARNING if is_main_process else logging.ERROR)
    transformers.utils.logging.disable_progress_bar()  # a bar per weight load and save, on every rank
    datasets.utils.logging.set_verbosity(logging.WARNING if is_main_process else logging.ERROR)
    if not (is_main_process and sys.stderr.isatty()):  # bar fragments would fill log files
        datasets.disable_progress_bars()


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Rank 0 runs the block first; the others then read its cache. Global, not per node: the first ranks
    of nodes sharing a cache would race writing the same Arrow files."""
    rank = TorchrunEnv.read().rank
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
    """After the first backward, each trainable parameter's gradient sum must be equal on every rank, as DDP
    averaged them (no gradient counts as NaN). One all_gather: call it once, not every step."""
    if not is_distributed():
        return
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not named:
        return
    nan = torch.tensor(math.nan, dtype=torch.float64)
    sums = torch.stack([p.grad.double().sum() if p.grad is not None else nan.to(p.device) for _, p in named])
    gathered = [torch.empty_like(sums) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, sums)
    for rank, other in enumerate(gathered[1:], start=1):
        same = torch.isclose(gathered[0], other, rtol=1e-5, atol=1e-8, equal_nan=True)
        if not same.all():
            differ = [name for (name, _), equal in zip(named, same.tolist(), strict=True) if not equal]
            raise RuntimeError(f"gradients differ between rank 0 and rank {rank} after the first step, in "
                               f"{some_of(differ)}: DDP did not average them. "
                               f"{why_not_averaged(named, gathered)}")


def why_not_averaged(named: list[tuple[str, torch.nn.Parameter]], gathered: list[torch.Tensor]) -> str:
    missing = torch.stack(gathered).isnan().any(dim=0).tolist()
    gradientless = [name for (name, _), none in zip(named, missing, strict=True) if none]
    if gradientless:
        return (f"{some_of(gradientless)} got no gradient on some rank: DDP all-reduces a bucket of "
                "gradients only once every parameter in it has one. A model whose forward skips parameters "
                "on some inputs needs --ddp_find_unused_parameters true")
    return ("Every parameter got a gradient, so DDP skipped no bucket: were parameters made trainable after "
            "the model was wrapped in DDP, or gradients changed after backward on one rank only?")


def some_of(names: list[str], shown: int = 6) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{len(names)} parameter tensor(s) ({', '.join(names[:shown])}{more})"


def cleanup_distributed() -> None:
    """The run's last step. A SIGTERM ends the process at once from here: nothing is left to save, and
    torchrun, re-forming the job around a node that joins, would otherwise wait 30 s for it. Then destroy
    the process group once nothing holds it: DDP's reference cycles keep it alive, and freed at exit, after
    the group, gloo's threads can abort. Callers drop their DDP wrappers first; gc frees the cycles."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
