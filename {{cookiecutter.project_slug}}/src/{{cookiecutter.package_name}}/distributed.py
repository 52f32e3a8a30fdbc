"""Rank, device, backend, precision, logging and agreement: what differs between processes, and keeping them in step."""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import datasets
import numpy as np
import torch
import torch.distributed as dist
import transformers

from .config import ConfigError
from .torchrun import STOPPED_EXIT_CODE  # noqa: F401 - the loops import it from here

# How long a process other than the first of its node waits before it exits on a bad setting (print_error).
ERROR_GRACE_SECONDS = 5


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
    there it silently runs in fp32. Only queries: bf16 support is read from this process's GPU
    (LOCAL_RANK) without pinning it, so argument parsing and the preflight can call this anywhere.
    """
    if mixed_precision not in ("auto", "bf16", "fp16", "no"):
        raise ConfigError(f"--mixed_precision {mixed_precision!r}: use auto, bf16, fp16 or no")
    if fp16 and bf16:
        raise ConfigError("--fp16 and --bf16 are both set; pick one (or use --mixed_precision)")
    explicit = "fp16" if fp16 else "bf16" if bf16 else None
    if explicit and mixed_precision not in ("auto", explicit):
        raise ConfigError(f"--{explicit} contradicts --mixed_precision {mixed_precision}; pass only one of them")

    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    on_gpu = cuda_available and not use_cpu

    precision = explicit or mixed_precision
    if on_gpu and precision in ("auto", "bf16"):
        if bf16_supported is None:
            bf16_supported = gpu_has_native_bf16(local_device_index())
        if precision == "bf16" and not bf16_supported:
            raise ConfigError("--mixed_precision bf16: this GPU has no native bf16 (V100 and T4 only emulate it, "
                             "slowly); use --mixed_precision fp16 or auto")
        precision = "bf16" if bf16_supported else "fp16"
    if precision == "auto":  # on CPU
        precision = "no"
    if precision == "fp16" and not on_gpu:
        raise ConfigError(
            "--mixed_precision fp16 needs a CUDA GPU: on CPU it would silently run in fp32; "
            "use --mixed_precision no (or bf16)"
        )
    if ddp_backend is None and env_world_size() > 1:
        ddp_backend = "nccl" if on_gpu else "gloo"
    return DeviceSettings(use_cpu=not on_gpu, ddp_backend=ddp_backend, precision=precision)


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """Mixed precision for the forward pass: bf16 or fp16 autocast on this device, or none ("no")."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def local_device_index() -> int:
    """The GPU this process drives: torchrun's LOCAL_RANK, 0 for a single process."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def gpu_has_native_bf16(index: int) -> bool:
    """A query of the GPU's compute capability (8.0, Ampere, and up), claiming no GPU and starting no kernel.

    Not torch.cuda.is_bf16_supported(): that reads the *current* device, GPU 0 until a rank pins its
    own, and with emulation counted, V100 and T4 "support" bf16, slowly.
    """
    if torch.version.hip:
        return True  # every ROCm GPU torch supports computes in bf16
    return torch.cuda.get_device_capability(index) >= (8, 0)


def select_device(use_cpu: bool, several_gpus: str = "refuse") -> torch.device:
    """This rank's device, pinned as the current CUDA device before anything else touches CUDA.

    NCCL binds to the current GPU: unpinned, every rank would use GPU 0. A run's setup calls this,
    never argument parsing, so that a one-process check (preflight, doctor) can parse the same flags
    on a node of 8 GPUs. One process without torchrun and several visible GPUs: training refuses
    (several_gpus="refuse"): the Trainer would wrap the model in DataParallel (a batch per GPU, no
    DDP) and the native loop would use GPU 0 alone. Prediction takes the first (several_gpus="first").
    """
    if use_cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if "LOCAL_RANK" not in os.environ and count > 1:
        if several_gpus == "refuse":
            raise ConfigError(f"{count} GPUs are visible to one process: start one process per GPU with "
                              "scripts/train_single_node.sh (torchrun), or set CUDA_VISIBLE_DEVICES=0")
        logging.getLogger(__package__).info("%d GPUs are visible to this one process: it uses cuda:0 alone", count)
    local_rank = local_device_index()
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def start_distributed(settings: DeviceSettings, timeout_seconds: int, several_gpus: str = "refuse") -> torch.device:
    """The run's setup, for the loops, predict and the doctor: pin this rank's device, then join torchrun's
    process group (when WORLD_SIZE > 1 and it is not joined yet). Returns the device.

    The settings are logged first: if joining the group hangs, the log says what it was waiting for.
    """
    device = select_device(settings.use_cpu, several_gpus)
    logging.getLogger(__package__).info("world size %d, device %s, backend %s, precision %s", env_world_size(),
                                        device, settings.ddp_backend, settings.precision)
    if env_world_size() > 1 and not dist.is_initialized():
        start_process_group(settings.ddp_backend, timeout_seconds, device)
    return device


def start_process_group(backend: str | None, timeout_seconds: int, device: torch.device) -> None:
    """Join torchrun's process group, with --ddp_timeout and this rank's GPU bound to it (device_id).

    Bound at start, NCCL sets up its communicator at once on the right GPU, instead of guessing
    lazily at the first collective (and warning at every barrier).
    """
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_seconds),
                            device_id=device if device.type == "cuda" else None)


def agree_on_precision(precision: str) -> None:
    """Refuse ranks that chose different precisions (a cluster mixing GPU types).

    Their gradients would be averaged at different scales (fp16 with a GradScaler, bf16 without) and
    the weights would drift apart; the gradient check cannot see it, as it runs after the all-reduce.
    """
    if not is_distributed():
        return
    chosen = [None] * dist.get_world_size()
    dist.all_gather_object(chosen, precision)
    if len(set(chosen)) > 1:
        ranks = ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(chosen))
        raise ConfigError(f"the ranks chose different precisions ({ranks}), as on a cluster mixing GPU types; "
                          "pass --mixed_precision fp16 (or no) so that every rank trains alike")


def env_world_size() -> int:
    """The world size torchrun announced; 1 for a plain `python -m` run."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def print_error(message: str) -> None:
    """Print a bad setting as one `error:` line: once per node under torchrun, where every rank found it.

    Not on rank 0 alone: files can differ between nodes, and a node's own problem must show. The node's
    other processes then wait a little before they exit: torchrun stops every process as soon as the first
    one ends, and the first process of the node, if it found the problem too, must have printed it by then.
    """
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"error: {message}", file=sys.stderr)
    elif env_world_size() > 1:
        time.sleep(ERROR_GRACE_SECONDS)


def usable_cpus() -> int:
    """The CPUs this process may run on: what the scheduler allows (SLURM's --cpus-per-task, a container's
    cpuset), not the machine's cores."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_dataloader_workers() -> int:
    """Loader processes per rank: this process's share of the CPUs it may run on, less one for itself, at most 4.

    The share counts what the scheduler allows (SLURM's --cpus-per-task, a container's cpuset), not
    the machine's cores; a fixed 4 oversubscribes small machines, and PyTorch warns about it.
    """
    per_process = usable_cpus() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(4, per_process - 1))


def is_distributed() -> bool:
    """Whether this process is one of several in a started process group."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def length_sorted_shard(lengths: list[int], rank: int, world_size: int) -> np.ndarray:
    """The row indices rank `rank` evaluates or predicts: every world_size-th row of the rows sorted longest
    first. Similar lengths share a batch (little padding), and no row is taken twice: a
    DistributedSampler would repeat rows to even out the ranks, and count them twice."""
    return np.argsort(-np.asarray(lengths), kind="stable")[rank::world_size]


def gather_shards(indices: np.ndarray, total: int, *columns: np.ndarray) -> list[np.ndarray] | None:
    """On rank 0, each column of every rank's shard put back at its rows (one array per column, `total`
    rows, in row order); None on the other ranks. Every rank of the group must call it."""
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


def setup_logging(is_main_process: bool) -> None:
    """Log progress from rank 0; the other ranks report warnings and errors only. No progress bars of
    the libraries but the data set's tokenising, on a terminal."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    logging.getLogger(__package__).setLevel(logging.INFO if is_main_process else logging.WARNING)
    transformers.utils.logging.set_verbosity(logging.WARNING if is_main_process else logging.ERROR)
    transformers.utils.logging.disable_progress_bar()  # a bar per weight load and checkpoint save, on every rank
    datasets.utils.logging.set_verbosity(logging.WARNING if is_main_process else logging.ERROR)
    if not (is_main_process and sys.stderr.isatty()):  # bar fragments would fill log files
        datasets.disable_progress_bars()


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Let rank 0 run the block first; the other ranks then read its cache.

    Global, not per node: on a cache that nodes share, each node's first rank writing the same Arrow
    files at once would race. With per-node caches the other nodes simply build theirs after.
    """
    rank = int(os.environ.get("RANK", "0"))
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
    if not is_distributed():
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


CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(output_dir: str | Path, last_file: str) -> list[Path]:
    """The checkpoint-N folders of output_dir that hold last_file, oldest first.

    last_file is what the loop writes last into a checkpoint (training_args.CHECKPOINT_LAST_FILE), so a
    save cut short never counts. Both loops and the preflight find checkpoints here.
    """
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(match.group(1)), path) for path in folder.iterdir()
             if (match := CHECKPOINT_NAME.match(path.name)) and (path / last_file).is_file()]
    return [path for _, path in sorted(found)]


def checkpoint_problem(path: Path, last_file: str) -> str | None:
    """What keeps the folder `path` from being resumed, or None."""
    if not path.exists():
        return "does not exist"
    if not (path / last_file).is_file():
        return (f"holds no {last_file}: pass a checkpoint-N folder written by this loop, or leave the flag out "
                "to resume from the newest one in --output_dir")
    return None


def agree_on_resume_checkpoint(
    explicit: str | None, output_dir: str, last_file: str,
    problem_with: Callable[[Path], str | None] | None = None,
) -> Path | None:
    """--resume_from_checkpoint if given, else the newest complete checkpoint in output_dir, else None.

    Rank 0 decides and every rank takes its answer: ranks that resumed from different steps would
    wait on each other forever. Then every rank checks that it can read that checkpoint, and all fail
    together: a rank failing alone would leave the others waiting until --ddp_timeout.
    `problem_with(path)` says what is wrong with a checkpoint folder, or returns None; by default
    checkpoint_problem. In one process (the preflight) it is the same choice and the same check.
    """
    problem_with = problem_with or functools.partial(checkpoint_problem, last_file=last_file)
    newest = complete_checkpoints(output_dir, last_file)[-1:] if explicit is None else []
    chosen = [Path(explicit) if explicit is not None else (newest[0] if newest else None)]
    if is_distributed():
        dist.broadcast_object_list(chosen, src=0)
    checkpoint = chosen[0]
    problems = [None if checkpoint is None else problem_with(checkpoint)]
    if is_distributed():
        problem, problems = problems[0], [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    if problems[0] is not None:
        flag = "--resume_from_checkpoint" if explicit is not None else "checkpoint"
        raise ConfigError(f"{flag} {str(checkpoint)!r} {problems[0]}")
    failed = [str(rank) for rank, problem in enumerate(problems) if problem is not None]
    if failed:
        raise ConfigError(
            f"checkpoint {str(checkpoint)!r} is on rank 0 but rank(s) {', '.join(failed)} cannot read it "
            f"({problems[int(failed[0])]}): with several nodes, --output_dir must be on a filesystem every node shares"
        )
    return checkpoint


def _hold_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _release_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


_forks_hold_sigterm = False


def fork_loader_workers_immune_to_sigterm() -> None:
    """From now on every process this one forks (the loader workers of each epoch) starts with SIGTERM
    blocked, and its worker_init_fn (keep_through_sigterm) keeps it blocked, ending only on its parent's.

    SLURM signals every process of a job step. A loader worker forked just then would die of it before
    its worker_init_fn runs (PyTorch's workers die of a SIGTERM that does not come from their parent),
    and the run with it, before it saves. Here a SIGTERM that comes during the fork waits for its end.
    """
    global _forks_hold_sigterm
    if not _forks_hold_sigterm:
        os.register_at_fork(before=_hold_sigterm, after_in_parent=_release_sigterm)
        _forks_hold_sigterm = True


class StopRequest:
    """SIGTERM asks the run to stop at the next step that every rank reaches, and to save it there.

    SLURM sends it to every process of the job step on preemption, requeue or cancel, Kubernetes to
    torchrun before it evicts a pod, and train_slurm.sbatch to torchrun before a time limit; torchrun
    (torchrun.py) passes it on to its workers and waits up to 30 s for them to save. The ranks can
    get it at different steps, so after each step they agree with one tiny all_reduce, on a CPU
    (gloo) group so that the host never waits for the GPU for it.
    """

    def __init__(self) -> None:
        self.signalled = False
        self.group = None
        if is_distributed():  # every rank creates the group: new_group is collective
            self.group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        signal.signal(signal.SIGTERM, self.on_signal)
        fork_loader_workers_immune_to_sigterm()

    def on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    def agreed(self) -> bool:
        """Whether any rank has been asked to stop; the same answer on every rank."""
        if self.group is None:
            return self.signalled
        flag = torch.tensor([int(self.signalled)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())


def keep_through_sigterm(worker_init_fn: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A DataLoader worker_init_fn: the loader worker ends on its parent's SIGTERM and ignores anyone else's,
    then runs worker_init_fn.

    SLURM signals every process of a job step, loader workers too, and PyTorch's workers die of a
    SIGTERM that does not come from their parent: the run would end with "DataLoader worker is killed
    by signal: Terminated" before it saves. Their parent's SIGTERM must still end them: at exit, and after
    any error (a peer's death, a bug in a step), multiprocessing stops its loader workers with SIGTERM and
    waits for them, and a worker that ignored it would keep its rank alive forever, and torchrun from
    restarting it. A worker also ends when its parent is gone (PyTorch's own check, every 5 s).
    """
    return functools.partial(_end_on_parent_sigterm_then, worker_init_fn)


def _end_on_parent_sigterm_then(worker_init_fn: Callable[[int], None] | None, worker_id: int) -> None:
    # Blocked, SIGTERM waits for sigwaitinfo, which says who sent it (a signal handler would not). The
    # worker was forked with it blocked (fork_loader_workers_immune_to_sigterm); a spawned one blocks it here.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_exit_on_sigterm_from, args=(os.getppid(),), name="sigterm-from-parent",
                     daemon=True).start()
    if worker_init_fn is not None:
        worker_init_fn(worker_id)


def _exit_on_sigterm_from(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)  # as PyTorch's own handler does for its parent's SIGTERM


def cleanup_distributed() -> None:
    """Destroy the process group once nothing holds it any more.

    DDP keeps the group alive through reference cycles; freed only at interpreter exit, after the
    group, gloo's threads can abort the process ("terminate called without an active exception").
    Callers drop their DDP wrappers first; the collection here frees the cycles.
    """
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
