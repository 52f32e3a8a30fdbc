"""Stopping on SIGTERM: the ranks save the step they all reach; loader workers live until their rank ends.

SLURM signals every process of a job step, loader workers too, and PyTorch's loader workers die of a SIGTERM
that does not come from their parent: the run would end with "DataLoader worker is killed by signal:
Terminated" before it saves. So loader workers ignore a SIGTERM from anyone but their parent, and one that
comes while a worker is forked waits until it does. Their parent's must still end them: at exit, and after any
error (a peer's death, a bug in a step), multiprocessing stops its loader workers with SIGTERM and waits for
them, and a worker that ignored it would keep its rank alive forever, and torchrun from restarting it.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from .compat import forking_loader_workers
from .distributed import is_distributed

_held = False  # whether _hold_sigterm blocked SIGTERM for the fork under way


def _hold_sigterm() -> None:
    global _held
    _held = forking_loader_workers()
    if _held:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def _release_sigterm() -> None:
    if _held:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _default_sigterm_unless_held() -> None:
    if not _held:  # the StopRequest's handler would only set a flag in a process that never reads it
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@functools.cache  # once: the handlers then run at every fork
def fork_loader_workers_immune_to_sigterm() -> None:
    """From now on every loader worker this process forks starts with SIGTERM blocked: one that comes
    during the fork waits until the worker's worker_init_fn (keep_through_sigterm) takes it over.

    Other forks start with SIGTERM unblocked and its default action, not the StopRequest's handler:
    datasets' map(num_proc=...) ends its processes with it (Pool.terminate), and one that ignored it
    would keep the rank waiting forever.
    """
    os.register_at_fork(before=_hold_sigterm, after_in_parent=_release_sigterm,
                        after_in_child=_default_sigterm_unless_held)


class StopRequest:
    """SIGTERM asks the run to stop at a step that every rank reaches, and to save it there.

    SLURM sends it to every process of the job step on preemption, requeue or cancel, Kubernetes to
    torchrun before it evicts a pod; torchrun (torchrun.py) passes it on to its workers. The ranks can
    get it at different steps, so they agree with one tiny all_reduce a step, on a CPU (gloo) group so that
    the host never waits for the GPU for it. It runs in the background: each step reads
    the answer started at the step before, so a rank may run a step ahead of the
    slowest one, and a stop comes a step later.
    """

    def __init__(self) -> None:
        self.signalled = False
        self.group = None
        self.pending: tuple[torch.Tensor, dist.Work] | None = None  # the all_reduce the last call started
        if is_distributed():  # every rank creates the group: new_group is collective
            self.group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        signal.signal(signal.SIGTERM, self.on_signal)
        fork_loader_workers_immune_to_sigterm()

    def on_signal(self, signum: int, frame: object) -> None:
        self.signalled = True

    def agreed(self) -> bool:
        """Whether any rank had been asked to stop by its previous call; the same answer on every rank."""
        if self.group is None:
            return self.signalled
        answer = False
        if self.pending is not None:
            flag, work = self.pending
            work.wait()
            answer = bool(flag.item())
        flag = torch.tensor([int(self.signalled)])
        self.pending = flag, dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return answer


def keep_through_sigterm(worker_init_fn: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A DataLoader worker_init_fn: the loader worker ends on its parent's SIGTERM and ignores anyone else's
    (a worker also ends when its parent is gone: PyTorch's own check, every 5 s), then runs worker_init_fn."""
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
