"""Cluster checks before a (multi-node) run: one PASS, WARN, FAIL or SKIP line per check, exit 1 on a FAIL.

Give it the CONFIG and flags you give train; it trains nothing. Alone, on each node before a job:

    MASTER_ADDR=node-a MASTER_PORT=29500 NPROC_PER_NODE=8 python -m <package>.doctor configs/default.yaml

it checks this machine: versions, GPUs against NPROC_PER_NODE, threads per CPU, that MASTER_ADDR
resolves and, on the master, that MASTER_PORT is free (elsewhere: that the host answers), and that
output_dir is writable. Under the launch scripts every rank runs it together:

    MODULE=<package>.doctor NODE_RANK=0 MASTER_ADDR=node-a scripts/train_multi_node.sh configs/default.yaml

and it also starts the process group as train does, times an all_reduce across all ranks, checks
that every rank reaches the workers' store at MASTER_ADDR:MASTER_PORT (under torchrun the store
holds that port, so it cannot be free), that every rank sees every other rank's file in
output_dir (checkpoints and resume need one filesystem shared by all nodes), and that all ranks run
the same torch, CUDA and NCCL.

It reads only output_dir, use_cpu, ddp_backend, ddp_timeout and the precision flags from CONFIG and
the flags, and leaves the other flags to the preflight and train: a CONFIG with a mistake elsewhere
still gets its cluster checked. The GPU checks only query the devices (count, name, memory, compute
capability); they claim none.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import os
import socket
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from transformers.hf_argparser import string_to_bool

from .config import ConfigError, load_config_file, split_config_path
from .device import resolve_device_settings
from .distributed import cleanup_distributed, start_distributed, usable_cpus
from .training_args import TrainingArguments

# A preflight must not hang for --ddp_timeout (30 minutes by default): collectives wait this long at most.
COLLECTIVE_TIMEOUT_S = 300
CONNECT_TIMEOUT_S = 5
# all_reduce sizes: 4 bytes for the round trip, then enough to approach the link's bandwidth.
BANDWIDTH_BYTES = {"nccl": 256 * 2**20, "gloo": 16 * 2**20}
ROUND_TRIPS, BANDWIDTH_ROUNDS = 20, 5
SETTINGS = ("output_dir", "use_cpu", "ddp_backend", "ddp_timeout", "mixed_precision", "fp16", "bf16")


@dataclass
class Result:
    status: str  # PASS, WARN (training runs, but look), FAIL (training would stop or hang), SKIP
    check: str
    detail: str

    def line(self) -> str:
        return f"{self.status}  {self.check}: {self.detail}"


@dataclass(frozen=True)
class Launch:
    """What torchrun told this process (or a single process when it did not start it)."""

    under_torchrun: bool
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int

    @classmethod
    def from_env(cls) -> Launch:
        env = os.environ
        if "TORCHELASTIC_RUN_ID" not in env:
            return cls(False, 0, 0, 1, 1, 0)
        return cls(True, int(env["RANK"]), int(env["LOCAL_RANK"]), int(env["WORLD_SIZE"]),
                   int(env["LOCAL_WORLD_SIZE"]), int(env["GROUP_RANK"]))

    @property
    def node(self) -> str:
        """' (node N, host)' when there are several nodes, so that each node's lines can be told apart."""
        if self.world_size == self.local_world_size:
            return ""
        return f" (node {self.node_rank}, {socket.gethostname()})"


def main(argv: list[str] | None = None) -> NoReturn:
    launch = Launch.from_env()
    settings = read_settings(sys.argv[1:] if argv is None else argv)
    results = []

    def report(result: Result, printed: bool) -> None:
        results.append(result)
        if printed:
            print(result.line(), flush=True)

    # What holds for the whole node: printed once per node, before anything that could hang.
    if launch.local_rank == 0:
        for check in (check_config, check_versions, check_torchrun, check_restarts, check_gpus, check_precision,
                      check_master):
            report(check(launch, settings), printed=True)
    if launch.world_size == 1:
        report(check_threads(local_threads(launch)), printed=True)
        report(check_output_dir_alone(settings.output_dir), printed=True)
        report(Result("SKIP", "backend", "one process starts no process group; run the doctor through a launch script "
                                         f"(MODULE={__package__}.doctor) to test the ranks together"), printed=True)
        finish(results, launch)
    # What holds for all ranks together: rank 0 prints it, and every rank its own failure to start.
    backend = start_backend(launch, settings)
    report(backend, printed=launch.rank == 0 or backend.status == "FAIL")
    if backend.status == "FAIL":
        finish(results, launch)
    results_of_all_ranks = check_together(launch, settings)
    if launch.rank == 0:
        for result in results_of_all_ranks:
            report(result, printed=True)
    finish(results, launch, group_works=True)


def finish(results: list[Result], launch: Launch, group_works: bool = False) -> NoReturn:
    """Exit 1 if a check failed (on any rank, where the group works); rank 0 prints the verdict."""
    counts = [sum(result.status == status for result in results) for status in ("FAIL", "WARN")]
    if group_works:
        totals = torch.tensor(counts, device=collective_device())
        dist.all_reduce(totals)  # also keeps every rank alive until all have printed their lines
        counts = totals.tolist()
    failed, warned = counts
    if launch.rank == 0:
        verdict = "fix the FAIL lines before training" if failed else "ready to train"
        print(f"doctor: {failed} failed, {warned} warning(s): {verdict}", flush=True)
    if group_works:
        # torchrun stops every rank once one has exited with a failure: none leaves before rank 0 has printed.
        dist.barrier()
    cleanup_distributed()
    raise SystemExit(1 if failed else 0)


# ---- settings: the few flags the doctor reads, from CONFIG and the command line ------------------------------


def read_settings(argv: list[str]) -> argparse.Namespace:
    """The flags of SETTINGS: the flags override CONFIG, CONFIG the loop's defaults.

    Also config_path, and config_problem: why CONFIG could not be read, or None.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.doctor", usage="%(prog)s [CONFIG] [--flag value ...]",
        description=f"Cluster checks before a run. Takes train's CONFIG and flags, and reads {', '.join(SETTINGS)}.",
        allow_abbrev=False)
    parser.add_argument("--output_dir")
    parser.add_argument("--use_cpu", type=string_to_bool, nargs="?", const=True)
    parser.add_argument("--ddp_backend")
    parser.add_argument("--ddp_timeout", type=int)
    parser.add_argument("--mixed_precision")
    parser.add_argument("--fp16", type=string_to_bool, nargs="?", const=True)
    parser.add_argument("--bf16", type=string_to_bool, nargs="?", const=True)
    defaults = {field.name: field.default for field in dataclasses.fields(TrainingArguments) if field.name in SETTINGS}
    problem = None
    try:
        config_path, flags = split_config_path(argv)
    except ConfigError as err:  # CONFIG missing: check the rest with the flags alone
        config_path, flags, problem = None, argv[1:], str(err)
    if config_path is not None:
        try:
            defaults.update({k: v for k, v in load_config_file(config_path).items() if k in SETTINGS})
        except ConfigError as err:
            problem = str(err)
    parser.set_defaults(**defaults, config_path=config_path, config_problem=problem)
    settings, _ = parser.parse_known_args(flags)  # train's other flags are train's to check
    return settings


# ---- this node: config, versions, torchrun, restarts, GPUs, master ----------------------------------------------


def check_config(launch: Launch, settings: argparse.Namespace) -> Result:
    if settings.config_problem is not None:
        return Result("FAIL", f"config{launch.node}",
                      f"{settings.config_problem}; the other checks use the flags and defaults")
    values = ", ".join(f"{name} {getattr(settings, name)}" for name in SETTINGS)
    return Result("PASS", f"config{launch.node}", f"read {settings.config_path or 'no CONFIG'} and the flags: {values}")


def versions() -> str:
    nccl = "none"
    if torch.cuda.is_available() and dist.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (CPU build)'}, NCCL {nccl}"


def check_versions(launch: Launch, settings: argparse.Namespace) -> Result:
    python = ".".join(map(str, sys.version_info[:3]))
    return Result("PASS", f"versions{launch.node}", f"{versions()}, Python {python}")


def check_torchrun(launch: Launch, settings: argparse.Namespace) -> Result:
    if not launch.under_torchrun:
        return Result("PASS", "torchrun", "not under torchrun: one process")
    env = os.environ
    first = launch.rank - launch.local_rank
    ranks = f"rank {first}" if launch.local_world_size == 1 else f"ranks {first}-{first + launch.local_world_size - 1}"
    detail = (f"{ranks} of WORLD_SIZE {launch.world_size} here (LOCAL_WORLD_SIZE {launch.local_world_size}), "
              f"node GROUP_RANK {launch.node_rank}; workers meet at MASTER_ADDR:MASTER_PORT "
              f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}")
    if not 0 <= launch.rank < launch.world_size or launch.local_world_size > launch.world_size:
        return Result("FAIL", f"torchrun{launch.node}", f"inconsistent: {detail}")
    return Result("PASS", f"torchrun{launch.node}", detail)


def check_restarts(launch: Launch, settings: argparse.Namespace) -> Result:
    if not launch.under_torchrun:
        return Result("SKIP", "restarts", "not under torchrun")
    max_restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if max_restarts == 0:
        return Result("PASS", f"restarts{launch.node}", "MAX_RESTARTS 0: a failed worker ends the job")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return Result("WARN", f"restarts{launch.node}",
                      f"MAX_RESTARTS {max_restarts}, but the workers share torchrun's rendezvous store (static "
                      "rendezvous, or TORCH_DISABLE_SHARE_RDZV_TCP_STORE unset): restarted workers can read stale "
                      "addresses and fail to connect (pytorch/pytorch#135712); use c10d rendezvous with "
                      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, as the launch scripts do by default")
    return Result("PASS", f"restarts{launch.node}",
                  f"MAX_RESTARTS {max_restarts}, this is restart {attempt}; each attempt gets a fresh store")


def check_gpus(launch: Launch, settings: argparse.Namespace) -> Result:
    name = f"GPUs{launch.node}"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nproc = os.environ.get("NPROC_PER_NODE", "")
    wanted = launch.local_world_size if launch.under_torchrun else int(nproc) if nproc.isdigit() else None
    if settings.use_cpu:
        return Result("PASS", name, f"--use_cpu: training on CPU, {count} GPU(s) left idle")
    if count == 0:
        hint = ("; torch is a CUDA build: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
                if torch.version.cuda else "")
        return Result("WARN", name, f"none visible: training would run on the CPU (gloo){hint}")
    models = describe_gpus(count)
    if wanted is None:
        return Result("PASS", name, f"{models}; NPROC_PER_NODE=auto starts one process per GPU")
    if count < wanted:
        return Result("FAIL", name, f"{wanted} processes on this node but {count} GPU(s) visible ({models}): set "
                                    f"NPROC_PER_NODE={count}, or check CUDA_VISIBLE_DEVICES")
    if count > wanted:
        return Result("WARN", name, f"{models}, but only {wanted} process(es): {count - wanted} GPU(s) stay idle")
    return Result("PASS", name, f"{models}, one per process")


def describe_gpus(count: int) -> str:
    names = []
    for index in range(count):
        properties = torch.cuda.get_device_properties(index)
        names.append(f"{properties.name} ({properties.total_memory / 2**30:.0f} GiB, capability "
                     f"{properties.major}.{properties.minor})")
    return ", ".join(f"{names.count(name)} x {name}" for name in dict.fromkeys(names))


def check_precision(launch: Launch, settings: argparse.Namespace) -> Result:
    """The precision train would pick on this node's GPU, from its compute capability (a query, no kernel)."""
    name = f"precision{launch.node}"
    try:
        chosen = resolve_device_settings(settings.mixed_precision, fp16=bool(settings.fp16), bf16=bool(settings.bf16),
                                         use_cpu=bool(settings.use_cpu), cuda_available=torch.cuda.is_available())
    except ConfigError as err:
        return Result("FAIL", name, str(err))
    if chosen.use_cpu:
        return Result("PASS", name, f"--mixed_precision {settings.mixed_precision} on CPU: {chosen.precision}")
    major, minor = torch.cuda.get_device_capability(launch.local_rank)
    return Result("PASS", name, f"--mixed_precision {settings.mixed_precision}: {chosen.precision} on GPU "
                                f"{launch.local_rank} (capability {major}.{minor})")


def check_master(launch: Launch, settings: argparse.Namespace) -> Result:
    """MASTER_ADDR resolves; alone, also: MASTER_PORT is free on the master, or the master answers."""
    name = f"master{launch.node}"
    address, port_text = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not address:
        return Result("SKIP", name, "MASTER_ADDR is not set: one node needs none")
    try:
        ips = sorted({info[4][0] for info in socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)})
    except (socket.gaierror, UnicodeError) as err:
        return Result("FAIL", name, f"MASTER_ADDR {address!r} does not resolve ({err}): every node must resolve it; "
                                    "use the master's IP address, or a name in DNS or /etc/hosts")
    where = f"MASTER_ADDR {address} ({', '.join(ips)})"
    if launch.under_torchrun:
        return Result("PASS", name, f"{where} resolves; its port is checked once the process group is up")
    if not port_text.isdigit():
        return Result("PASS", name, f"{where} resolves; set MASTER_PORT to check the port too")
    port = int(port_text)
    if any(is_local_address(ip) for ip in ips):
        if port_is_free(port):
            return Result("PASS", name, f"{where} is this machine, and MASTER_PORT {port} is free")
        return Result("FAIL", name, f"{where} is this machine, but MASTER_PORT {port} is in use: another job or a "
                                    "leftover torchrun holds it; pick another MASTER_PORT, or end that process")
    problem = connect_problem(address, port)
    if problem is None:
        return Result("PASS", name, f"{where}: port {port} accepts connections (the master's rendezvous is up)")
    if problem == "refused":
        return Result("PASS", name, f"{where} answers; nothing listens on port {port} yet, as expected before the "
                                    "master's torchrun starts")
    return Result("FAIL", name, f"{where}: port {port} {problem}: open it between the nodes, or check the address")


def is_local_address(ip: str) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, 0))
        except OSError:
            return False
    return True


def port_is_free(port: int) -> bool:
    """Whether torchrun could bind the port on every interface (as its store does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore: TIME_WAIT leftovers do not count
        try:
            sock.bind(("", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def connect_problem(address: str, port: int) -> str | None:
    """None if a TCP connection opens; 'refused' if the host answered that nothing listens; else what went wrong."""
    try:
        socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S).close()
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return f"gave no answer within {CONNECT_TIMEOUT_S} s (a firewall dropping it, or the host is down)"
    except OSError as err:
        return f"is unreachable ({err.strerror or err})"
    return None


# ---- threads and output_dir, for one process ---------------------------------------------------------------------


def local_threads(launch: Launch) -> dict:
    """This node's processes and their threads, and the host's CPUs: gathered on rank 0 under torchrun.

    Alone, the doctor speaks for the NPROC_PER_NODE processes a launch script would start, each with
    OMP_NUM_THREADS threads, or with CPUs / processes where it is unset, as the scripts set it.
    """
    cpus, nproc, omp = usable_cpus(), os.environ.get("NPROC_PER_NODE", ""), os.environ.get("OMP_NUM_THREADS", "")
    if launch.under_torchrun:
        processes, threads = 1, torch.get_num_threads()  # each rank reports for itself
    else:
        processes = int(nproc) if nproc.isdigit() and int(nproc) > 0 else 1
        threads = int(omp) if omp.isdigit() else max(1, cpus // processes)
    return {"host": socket.gethostname(), "node": launch.node_rank, "threads": threads * processes, "cpus": cpus}


def check_threads(*everyone: dict) -> Result:
    """Threads of all processes on each host against its CPUs (several nodes can share one host)."""
    omp = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    hosts: dict[str, list[dict]] = {}
    for facts in everyone:
        hosts.setdefault(facts["host"], []).append(facts)
    notes, oversubscribed = [], []
    for host, ranks in hosts.items():
        threads = sum(facts["threads"] for facts in ranks)
        nodes = len({facts["node"] for facts in ranks})
        nodes_note = f" ({nodes} nodes)" if nodes > 1 else ""
        notes.append(f"host {host}{nodes_note}: {threads} threads on {ranks[0]['cpus']} CPUs")
        if threads > ranks[0]["cpus"]:
            oversubscribed.append((host, nodes))
    detail = f"{omp}; " + "; ".join(notes)
    if not oversubscribed:
        return Result("PASS", "threads", detail)
    if any(nodes > 1 for _, nodes in oversubscribed):
        advice = "several nodes share a host: set OMP_NUM_THREADS=1 on each (2x faster on 2 nodes of one host)"
    else:
        advice = "set OMP_NUM_THREADS to CPUs / processes (the launch scripts do when it is unset)"
    return Result("WARN", "threads", f"{detail}: more threads than CPUs; {advice}")


def write_token(output_dir: str, name: str, token: str) -> Path:
    """Create output_dir if needed and write one token file in output_dir/<name>; OSError if it cannot."""
    folder = Path(output_dir, name)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / token
    path.write_text(socket.gethostname() + "\n")
    return path


def check_output_dir_alone(output_dir: str) -> Result:
    name = ".doctor-" + uuid.uuid4().hex[:12]
    try:
        path = write_token(output_dir, name, "probe")
    except OSError as err:
        return unwritable(output_dir, [f"this process: {err}"])
    path.unlink()
    path.parent.rmdir()
    return Result("PASS", "output_dir", f"{output_dir} is writable (one process: sharing across nodes not checked)")


def unwritable(output_dir: str, problems: list[str]) -> Result:
    return Result("FAIL", "output_dir", f"{output_dir} is not writable ({'; '.join(problems)}): checkpoints, the "
                                        "final model and metrics.json go there; pass a --output_dir you can write")


# ---- the ranks together: backend, then what rank 0 compares across ranks -------------------------------------------


def collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def start_backend(launch: Launch, settings: argparse.Namespace) -> Result:
    """Start the process group as train does, then time all_reduce: a 4-byte round trip, and a large one's bandwidth."""
    try:
        device_settings = resolve_device_settings("no", use_cpu=bool(settings.use_cpu),
                                                  ddp_backend=settings.ddp_backend)
        backend = device_settings.ddp_backend
        started = time.perf_counter()
        device = start_distributed(device_settings, min(settings.ddp_timeout, COLLECTIVE_TIMEOUT_S))
        startup = time.perf_counter() - started
        small = torch.full((1,), float(launch.rank + 1), device=device)
        dist.all_reduce(small)
        expected = launch.world_size * (launch.world_size + 1) / 2
        if small.item() != expected:
            return Result("FAIL", "backend", f"{backend}: all_reduce summed to {small.item()}, not {expected}")
        round_trip = statistics.median(timed_all_reduce(small, ROUND_TRIPS))
        large = torch.ones(BANDWIDTH_BYTES.get(backend, BANDWIDTH_BYTES["gloo"]) // 4, device=device)
        seconds = statistics.median(timed_all_reduce(large, BANDWIDTH_ROUNDS + 1)[1:])  # the first one warms up
    except Exception as err:  # any failure here is the finding: report it, with the rank that saw it
        return Result("FAIL", "backend", f"rank {launch.rank}: the process group did not work ({type(err).__name__}: "
                                         f"{err}); see the troubleshooting table in README.md")
    size = large.numel() * 4
    # As nccl-tests report it: what each rank's link carries for a ring all_reduce, 2(n-1)/n of the data.
    bus_bandwidth = size / seconds * 2 * (launch.world_size - 1) / launch.world_size
    return Result("PASS", "backend", f"{backend} started in {startup:.3g} s on {launch.world_size} ranks; all_reduce "
                                     f"round trip {round_trip * 1e3:.2f} ms (4 bytes), {size // 2**20} MiB in "
                                     f"{seconds * 1e3:.1f} ms: bus bandwidth {bus_bandwidth / 1e9:.2f} GB/s")


def timed_all_reduce(tensor: torch.Tensor, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        if tensor.is_cuda:
            torch.cuda.synchronize()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        if tensor.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times


def check_together(launch: Launch, settings: argparse.Namespace) -> list[Result]:
    """Every rank writes a token in output_dir and tries the master's port; rank 0 compares what all saw."""
    shared = [".doctor-" + uuid.uuid4().hex[:12]]
    dist.broadcast_object_list(shared, src=0)
    token_folder = shared[0]
    token, written, write_error = f"rank{launch.rank}", None, None
    try:
        written = write_token(settings.output_dir, token_folder, token)
    except OSError as err:
        write_error = str(err)
    dist.barrier()
    folder = Path(settings.output_dir, token_folder)
    seen = sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []
    facts = local_threads(launch) | {
        "rank": launch.rank, "versions": versions(), "write_error": write_error, "seen": seen,
        "master": connect_problem(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])),
    }
    everyone = [None] * launch.world_size
    dist.all_gather_object(everyone, facts)
    if written is not None:
        written.unlink()
    dist.barrier()
    if launch.local_rank == 0:
        with contextlib.suppress(OSError):  # not shared: each node's local rank 0 removes its own copy
            folder.rmdir()
    return [compare_versions(everyone), check_threads(*everyone), compare_master(everyone),
            compare_output_dir(settings.output_dir, everyone)]


def compare_versions(everyone: list[dict]) -> Result:
    found = {facts["versions"] for facts in everyone}
    if len(found) == 1:
        return Result("PASS", "same versions", f"all {len(everyone)} ranks run {found.pop()}")
    which = "; ".join(f"rank {facts['rank']} ({facts['host']}): {facts['versions']}" for facts in everyone)
    return Result("FAIL", "same versions", f"the ranks run different versions, which can hang collectives: {which}; "
                                           "install the same environment on every node")


def compare_master(everyone: list[dict]) -> Result:
    address, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    failed = [f"rank {facts['rank']} ({facts['host']}): {facts['master']}" for facts in everyone if facts["master"]]
    if failed:
        return Result("FAIL", "master port", f"{address}:{port} refused or unreachable from {'; '.join(failed)}")
    return Result("PASS", "master port", f"{address}:{port} accepts connections from all {len(everyone)} ranks (under "
                                         "torchrun the workers' store holds it, so it is in use, as it should be)")


def compare_output_dir(output_dir: str, everyone: list[dict]) -> Result:
    errors = [f"rank {facts['rank']} ({facts['host']}): {facts['write_error']}"
              for facts in everyone if facts["write_error"]]
    if errors:
        return unwritable(output_dir, errors)
    tokens = {f"rank{facts['rank']}" for facts in everyone}
    blind = [f"rank {facts['rank']} ({facts['host']}) sees {len(set(facts['seen']) & tokens)} of {len(tokens)}"
             for facts in everyone if not tokens <= set(facts["seen"])]
    if blind:
        return Result("FAIL", "output_dir", f"{output_dir} is not one folder shared by all ranks ({'; '.join(blind)} "
                                            "ranks' files): resume reads rank 0's checkpoints on every rank; put "
                                            "--output_dir on a filesystem every node mounts")
    return Result("PASS", "output_dir", f"{output_dir} is writable, and all {len(everyone)} ranks see each other's "
                                        "files in it")


if __name__ == "__main__":
    main()
