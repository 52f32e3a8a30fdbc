"""Cluster checks: a job's ranks started as train starts them (MODULE=<package>.doctor in a launch script,
with train's CONFIG and flags), and compared; nothing is trained. One PASS, WARN, FAIL or SKIP line per
check (docs/multi-node.md lists them); exit status 1 on a FAIL, 2 on a command line train refuses.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from .config import parse_args
from .device import DeviceSettings, training_device_settings
from .distributed import cleanup_distributed, exit_on_config_error, start_distributed
from .torchrun import TorchrunEnv
from .training_args import TrainingArguments

# The doctor must not hang for --ddp_timeout (30 minutes by default): a collective waits this long at most.
COLLECTIVE_TIMEOUT_S = 300
# all_reduce sizes: 4 bytes for the round trip, then enough to approach the link's bandwidth.
BANDWIDTH_BYTES = {"nccl": 256 * 2**20, "gloo": 16 * 2**20}
ROUND_TRIPS, BANDWIDTH_ROUNDS = 20, 5


@dataclass
class Result:
    status: str  # PASS, WARN (training runs, but look), FAIL (training would stop or hang), SKIP
    check: str
    detail: str


def main(argv: list[str] | None = None) -> NoReturn:
    env = TorchrunEnv.read()
    with exit_on_config_error():
        _, _, args = parse_args(TrainingArguments, argv)
        settings = training_device_settings(args)
    # Once per node, before anything that could hang.
    results = show([check_gpus(env, settings)] if env.local_rank == 0 else [])
    if env.world_size == 1:
        alone = Result("SKIP", "ranks", "one process, no process group: run the doctor through a launch "
                                        f"script (MODULE={__package__}.doctor) to check the ranks together")
        output_dir = compare_output_dir(args.output_dir, gather_facts(env, args.output_dir))
        finish(results + show([output_dir, alone]), env)
    backend = start_backend(env, settings, args.ddp_timeout)
    if env.rank == 0 or backend.status == "FAIL":  # each rank prints its own failure
        results += show([backend])
    if backend.status == "FAIL":
        finish(results, env)
    everyone = gather_facts(env, args.output_dir)
    if env.rank == 0:
        results += show([compare_versions(everyone), compare_output_dir(args.output_dir, everyone)])
    finish(results, env, group_works=True)


def show(results: list[Result]) -> list[Result]:
    for result in results:
        print(f"{result.status}  {result.check}: {result.detail}", flush=True)
    return results


def finish(results: list[Result], env: TorchrunEnv, group_works: bool = False) -> NoReturn:
    """Exit 1 if a check failed (on any rank, where the group works); rank 0 prints the verdict."""
    counts = [sum(result.status == status for result in results) for status in ("FAIL", "WARN")]
    if group_works:
        totals = torch.tensor(counts, device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(totals)  # also keeps every rank alive until all have printed their lines
        counts = totals.tolist()
    failed, warned = counts
    if env.rank == 0:
        verdict = "fix the FAIL lines before training" if failed else "ready to train"
        print(f"doctor: {failed} failed, {warned} warning(s): {verdict}", flush=True)
    if group_works:
        dist.barrier()  # torchrun stops every rank once one exits with a failure: not before rank 0 printed
    cleanup_distributed()
    raise SystemExit(1 if failed else 0)


def check_gpus(env: TorchrunEnv, settings: DeviceSettings) -> Result:
    """The GPUs visible here against the processes on this node (a rank without one fails to start), and
    the precision train picks on them."""
    several_nodes = env.world_size > env.local_world_size  # then each node's line names it
    name = f"GPUs (node {env.node_rank}, {socket.gethostname()})" if several_nodes else "GPUs"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        hint = "; torch is a CUDA build: check nvidia-smi, CUDA_VISIBLE_DEVICES" if torch.version.cuda else ""
        return Result("WARN", name, f"none visible: training would run on the CPU (gloo){hint}")
    if settings.use_cpu:
        return Result("PASS", name, f"--use_cpu: training on CPU, {count} GPU(s) left idle")
    nproc = os.environ.get("NPROC_PER_NODE", "")
    wanted = env.local_world_size if env.started else int(nproc) if nproc.isdigit() else None
    gpus = f"{describe_gpus(count)}; precision {settings.precision}"
    if wanted is None:  # NPROC_PER_NODE unset or auto (one process per GPU): nothing to compare
        return Result("PASS", name, gpus)
    if count < wanted:
        return Result("FAIL", name, f"{wanted} processes on this node but {count} GPU(s) visible "
                                    f"({gpus}): set NPROC_PER_NODE={count}, or check CUDA_VISIBLE_DEVICES")
    if count > wanted:
        return Result("WARN", name, f"{gpus}; only {wanted} process(es): {count - wanted} GPU(s) stay idle")
    return Result("PASS", name, f"{gpus}; one process per GPU")


def describe_gpus(count: int) -> str:
    names = [f"{gpu.name} ({gpu.total_memory / 2**30:.0f} GiB, capability {gpu.major}.{gpu.minor})"
             for gpu in map(torch.cuda.get_device_properties, range(count))]
    return ", ".join(f"{number} x {name}" for name, number in Counter(names).items())


def start_backend(env: TorchrunEnv, settings: DeviceSettings, ddp_timeout: int) -> Result:
    """Start the process group as train does, then time all_reduce: a 4-byte round trip, and a large one."""
    backend = settings.ddp_backend
    try:
        started = time.perf_counter()
        device = start_distributed(settings, min(ddp_timeout, COLLECTIVE_TIMEOUT_S))
        startup = time.perf_counter() - started
        small = torch.full((1,), float(env.rank + 1), device=device)
        dist.all_reduce(small)
        expected = env.world_size * (env.world_size + 1) / 2
        if small.item() != expected:
            return Result("FAIL", "backend", f"{backend}: all_reduce summed to {small.item()}, "
                                             f"not {expected}")
        round_trip = statistics.median(timed_all_reduce(small, ROUND_TRIPS))
        large = torch.ones(BANDWIDTH_BYTES.get(backend, BANDWIDTH_BYTES["gloo"]) // 4, device=device)
        seconds = statistics.median(timed_all_reduce(large, BANDWIDTH_ROUNDS + 1)[1:])  # the first warms up
    except Exception as err:  # any failure here is the finding: report it, with the rank that saw it
        return Result("FAIL", "backend", f"rank {env.rank}: the process group did not work "
                                         f"({type(err).__name__}: {err}); see docs/troubleshooting.md")
    size = large.numel() * 4
    # As nccl-tests report it: what each rank's link carries for a ring all_reduce, 2(n-1)/n of the data.
    bus_bandwidth = size / seconds * 2 * (env.world_size - 1) / env.world_size
    # The group's env:// rendezvous connected every rank to MASTER_ADDR:MASTER_PORT (the workers' store).
    store = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return Result("PASS", "backend", f"{backend} started in {startup:.3g} s on {env.world_size} ranks, all "
                                     f"connected to the store at {store}; all_reduce round trip "
                                     f"{round_trip * 1e3:.2f} ms (4 bytes), {size // 2**20} MiB in "
                                     f"{seconds * 1e3:.1f} ms: bus bandwidth {bus_bandwidth / 1e9:.2f} GB/s")


def timed_all_reduce(tensor: torch.Tensor, rounds: int) -> list[float]:
    synchronize = torch.cuda.synchronize if tensor.is_cuda else lambda: None  # time the GPU's work too
    times = []
    for _ in range(rounds):
        synchronize()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        synchronize()
        times.append(time.perf_counter() - started)
    return times


def gather_facts(env: TorchrunEnv, output_dir: str) -> list[dict]:
    """Every rank writes a file into one new folder in output_dir and lists the folder once all have:
    what each rank found, by rank (in one process, its own). The folder is removed after."""
    together = env.world_size > 1
    name = [".doctor-" + uuid.uuid4().hex[:12]]
    if together:
        dist.broadcast_object_list(name, src=0)
    folder = Path(output_dir, name[0])
    token, error = folder / f"rank{env.rank}", None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        token.write_text(socket.gethostname() + "\n")
    except OSError as err:
        error = str(err)
    facts = {"rank": env.rank, "host": socket.gethostname(), "versions": versions(), "write_error": error}
    everyone = [facts]
    if together:
        dist.barrier()  # every rank has written
        facts["seen"] = sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []
        everyone = [None] * env.world_size
        dist.all_gather_object(everyone, facts)
    if error is None:
        token.unlink()
    if together:
        dist.barrier()  # every rank has removed its file
    if env.local_rank == 0:
        with contextlib.suppress(OSError):  # in a folder that nodes do not share, each node removes its own
            folder.rmdir()
    return everyone


def versions() -> str:
    nccl = "none"
    if torch.cuda.is_available() and dist.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}, NCCL {nccl}"


def compare_versions(everyone: list[dict]) -> Result:
    found = {facts["versions"] for facts in everyone}
    if len(found) == 1:
        return Result("PASS", "same versions", f"all {len(everyone)} ranks run {found.pop()}")
    which = "; ".join(f"rank {facts['rank']} ({facts['host']}): {facts['versions']}" for facts in everyone)
    return Result("FAIL", "same versions", f"the ranks run different versions, which can hang collectives: "
                                           f"{which}; install the same environment on every node")


def compare_output_dir(output_dir: str, everyone: list[dict]) -> Result:
    errors = [f"rank {facts['rank']} ({facts['host']}): {facts['write_error']}"
              for facts in everyone if facts["write_error"]]
    if errors:
        return Result("FAIL", "output_dir", f"{output_dir} is not writable ({'; '.join(errors)}): "
                                            "checkpoints, the final model and metrics.json go there; pass a "
                                            "--output_dir you can write")
    if len(everyone) == 1:
        return Result("PASS", "output_dir", f"{output_dir} is writable (one process: sharing not checked)")
    tokens = {f"rank{facts['rank']}" for facts in everyone}
    blind = [f"rank {facts['rank']} ({facts['host']}) sees {len(tokens & set(facts['seen']))} of "
             f"{len(tokens)}" for facts in everyone if not tokens <= set(facts["seen"])]
    if blind:
        return Result("FAIL", "output_dir", f"{output_dir} is not one folder shared by all ranks "
                                            f"({'; '.join(blind)} ranks' files): resume reads rank 0's "
                                            "checkpoints on every rank; put --output_dir on a filesystem "
                                            "every node mounts")
    return Result("PASS", "output_dir", f"{output_dir} is writable, and all {len(everyone)} ranks see each "
                                        "other's files in it")


if __name__ == "__main__":
    main()
