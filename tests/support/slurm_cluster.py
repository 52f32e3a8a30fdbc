"""A real, throw-away SLURM cluster for tests: munged + slurmctld + slurmd(s), all under one folder.

Shapes:
  SlurmCluster(dir, nodes=1)  one CPU node: the host itself (node name = its short host name, NodeAddr=127.0.0.1).
  SlurmCluster(dir, nodes=2)  two CPU nodes on this one host, `slurm-node1` and `slurm-node2`: each slurmd runs in
                              a network namespace, a UTS namespace (own host name) and a mount namespace (own
                              /etc/hosts) of its own, so a job step on node 2 sees node 2's host name and address
                              and can reach node 1 by its name, as torchrun's c10d rendezvous needs.

Network of the two-node shape (N: a free index 1-250, one per live cluster on the machine):
  host netns: veth `slcN-h`  10.233.N.1/24   slurmctld and the clients (sbatch, scontrol...) use this address
  netns `slurm-cN-hub`: a bridge joining the host's veth and the nodes' (its iptables is empty, so Docker's
                        FORWARD=DROP policy on the host, with br_netfilter loaded, cannot drop node-to-node traffic)
  netns `slurm-cN-node1`: eth0 10.233.N.11/24,   netns `slurm-cN-node2`: eth0 10.233.N.12/24
  No default route anywhere, no forwarding, no NAT: 10.233.N.0/24 is reachable only between these interfaces.
  The slurmds are started with `nsenter --net=/run/netns/...` (not `ip netns exec`, which remounts /sys and
  so hides the cgroup hierarchy from slurmd), then `unshare --uts --mount` to set the host name and bind a
  private hosts file over /etc/hosts; the machine's own /etc/hosts is never written.

Everything the daemons write (config, munge key and socket, state, logs, pid files) is under the
folder given. Outside it, and removed again by stop(): slurmd's spool (a short /tmp/slurm-spool-* folder:
the step sockets named after it must fit 108 bytes), the namespaces and the veth above, SLURM's cgroup
folders (/sys/fs/cgroup/<controller>/slurm_<node>: the empty ones; only those it added while another live
cluster has a node of the same name), and a lock
file /run/slurm_cluster/<N>.json that reserves the index N and lets a later run clean up after a run that
was killed (SIGKILL) before it could stop its cluster.

Plain Python, standard library only: the template's own tests import this file by path too.
CLI for trying scripts by hand:  python tests/slurm_cluster.py up --nodes 2 --dir /tmp/slurm
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
NETNS_TOOLS = ("ip", "nsenter", "unshare")
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
LOCK_DIR = Path("/run/slurm_cluster")
SUBNET_PREFIX = "10.233"  # 10.233.N.0/24, used only on the interfaces this file creates
MARKER = "SLURM_CLUSTER_HARNESS"  # in the daemons' environment: finds what they started (slurmstepd...)
_ENSURED: dict[str, str | None] = {}


class SlurmClusterError(RuntimeError):
    pass


# ----------------------------------------------------------------------------------------------- requirements
def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def ensure_slurm() -> str | None:
    """None when slurmctld, slurmd, munged and the clients are there (installing `slurm-wlm munge` with apt-get
    if they are not), else a one-line reason. The install is kept from starting the packages' system services
    (a temporary /usr/sbin/policy-rc.d that answers 101, only when there is none)."""
    if "slurm" in _ENSURED:
        return _ENSURED["slurm"]
    reason = _ensure_slurm()
    _ENSURED["slurm"] = reason
    return reason


def _missing(programs) -> list[str]:
    return [name for name in programs if shutil.which(name, path=_path()) is None]


def _ensure_slurm() -> str | None:
    if sys.platform != "linux":
        return f"a SLURM test cluster needs Linux, not {sys.platform}"
    missing = _missing(DAEMONS + CLIENTS)
    if not missing:
        return _need_root()
    return _apt_install(["slurm-wlm", "munge"], missing, DAEMONS + CLIENTS)


def _apt_install(packages: list[str], missing: list[str], programs) -> str | None:
    """apt-get install packages (apt-get update first if that fails); None when programs are then all there."""
    if _need_root():
        return f"{', '.join(missing)} missing, and {_need_root()}"
    if shutil.which("apt-get") is None:
        return f"{', '.join(missing)} missing, and no apt-get to install {' '.join(packages)}"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = Path("/usr/sbin/policy-rc.d")
    wrote_policy = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\n# slurm_cluster.py: no services started while it installs packages\nexit 101\n")
        policy.chmod(0o755)
        wrote_policy = True
    try:
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
        result = subprocess.run(install, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
            result = subprocess.run(install, env=env, capture_output=True, text=True)
    finally:
        if wrote_policy:
            policy.unlink(missing_ok=True)
    still = _missing(programs)
    if result.returncode != 0 or still:
        last = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"])[-1]
        return f"'apt-get install {' '.join(packages)}' failed (status {result.returncode}): {last}"
    return None


def _need_root() -> str | None:
    return None if os.geteuid() == 0 else f"the SLURM daemons need root, and this is uid {os.geteuid()}"


def ensure_netns() -> str | None:
    """None when this process can make network, UTS and mount namespaces (root; ip, nsenter and unshare,
    installing iproute2 and util-linux with apt-get if they are missing), else a one-line reason."""
    if "netns" in _ENSURED:
        return _ENSURED["netns"]
    reason = _ensure_netns()
    _ENSURED["netns"] = reason
    return reason


def _ensure_netns() -> str | None:
    if sys.platform != "linux":
        return f"network namespaces need Linux, not {sys.platform}"
    if _need_root():
        return _need_root()
    missing = _missing(NETNS_TOOLS)
    if missing:
        reason = _apt_install(["iproute2", "util-linux"], missing, NETNS_TOOLS)
        if reason:
            return reason
    probe = subprocess.run(
        ["unshare", "--net", "--uts", "--mount", "sh", "-c", "hostname probe && ip link set lo up"],
        capture_output=True, text=True,
    )
    if probe.returncode != 0:
        return f"cannot make network/UTS/mount namespaces here: {' '.join(probe.stderr.split())[:200] or 'no message'}"
    return None


def _require(reason: str | None) -> None:
    import pytest  # only the pytest helpers need it

    if reason is None:
        return
    if _in_ci():
        pytest.fail(f"CI=true, and a skipped SLURM test is a failure there: {reason}")
    pytest.skip(reason)


def require_slurm(nodes: int = 1) -> None:
    """In a test: skip when no SLURM cluster can be made here (nodes=2 also needs namespaces); fail when CI=true."""
    _require(ensure_slurm())
    if nodes > 1:
        _require(ensure_netns())


def require_netns() -> None:
    """In a test: skip when no network namespaces can be made here; fail when CI=true."""
    _require(ensure_netns())


# ---------------------------------------------------------------------------------------------- small helpers
def _path() -> str:
    parts = os.environ.get("PATH", "").split(os.pathsep)
    for extra in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if extra not in parts:
            parts.append(extra)
    return os.pathsep.join(p for p in parts if p)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 25) -> str:
    """The last lines of a job's log, after the first lines anywhere in it that report an error: with two
    nodes, the rank that failed first is often far above the tail, which shows the others' reactions."""
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"({path}: {error})"
    errors = [line[:300] for line in text.splitlines() if re.search(r"Error\b|error:|^\s*raise ", line)][:12]
    return ("first error lines:\n" + "\n".join(errors) + "\n--- last lines:\n" if errors else "") + "\n".join(
        text.splitlines()[-lines:])


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks): a PID plus this names one process, not a reused PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _alive(pid: int, start: int | None) -> bool:
    if start is None:
        return False
    now = _start_time(pid)
    if now != start:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _pdeathsig() -> None:
    """In the daemon before exec: die (SIGTERM) if the process that started the cluster dies without stop()."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _lock_owner_alive(data: dict) -> bool:
    pid = data.get("pid")
    return isinstance(pid, int) and _start_time(pid) == data.get("start")


def _run_quiet(args: list[str]) -> None:
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cleanup_network(netns: list[str], links: list[str]) -> None:
    for link in links:
        if Path(f"/sys/class/net/{link}").exists():
            _run_quiet(["ip", "link", "del", link])
    for name in netns:
        if Path(f"/run/netns/{name}").exists():
            _run_quiet(["ip", "netns", "del", name])


def _marked_processes(marker: str, pids: tuple[int, ...] | list[int] = ()) -> list[tuple[int, int]]:
    """(pid, start time) of the processes whose environment holds MARKER=marker, of pids, and of all their
    descendants (a job's tasks have the job's environment, not the daemons', but descend from slurmstepd)."""
    parents: dict[int, int] = {}
    owned: set[int] = set(pids)
    needle = f"{MARKER}={marker}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        parent = _parent(pid)
        if parent is not None:
            parents[pid] = parent
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            owned.add(pid)
    changed = True
    while changed:
        changed = False
        for pid, parent in parents.items():
            if parent in owned and pid not in owned:
                owned.add(pid)
                changed = True
    owned.discard(os.getpid())
    return [(pid, start) for pid in sorted(owned) if _alive(pid, start := _start_time(pid))]


def _kill_all(processes: list[tuple[int, int]], timeout: float = 5.0) -> None:
    """SIGKILL these (pid, start time) processes, and wait until they are gone (or zombies)."""
    processes = [(pid, start) for pid, start in processes if pid != os.getpid()]
    for pid, start in processes:
        if _alive(pid, start):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(pid, start) for pid, start in processes) and time.monotonic() < deadline:
        time.sleep(0.05)


def _cgroup_dirs(node_names: list[str]) -> list[Path]:
    """SLURM's cgroup v1 folders of these nodes, /sys/fs/cgroup/<controller>/slurm_<node> (Debian's slurmd keeps
    one per node name). Never /sys/fs/cgroup/*/slurm, a system slurmd's."""
    root = Path("/sys/fs/cgroup")
    if not root.is_dir() or not node_names:
        return []
    return [c / f"slurm_{n}" for c in root.iterdir() for n in node_names if (c / f"slurm_{n}").is_dir()]


def _remove_empty_cgroups(node_names: list[str], keep: set[Path] = frozenset()) -> None:
    """rmdir, deepest first, the folders under those cgroups that hold no process (rmdir refuses the others)."""
    for folder in sorted(set(_cgroup_dirs(node_names)) - set(keep)):
        for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir(sub)
        _rmdir(folder)


def _node_names_in_use(node_names: list[str], own_lock: Path | None) -> bool:
    """Whether a live cluster (other than own_lock's) may use one of these node names."""
    for lock in LOCK_DIR.glob("*.json") if LOCK_DIR.is_dir() else []:
        if lock == own_lock:
            continue
        try:
            data = json.loads(lock.read_text())
        except (OSError, ValueError):
            return True  # being written: a cluster starting
        shared = not isinstance(data, dict) or "nodes" not in data or set(data["nodes"]) & set(node_names)
        if shared and isinstance(data, dict) and _lock_owner_alive(data):
            return True
    return False


def _cleanup_stale(data: dict) -> None:
    """What a run killed before its stop() left (its lock file says what): its daemons' children, which
    PR_SET_PDEATHSIG does not reach (slurmstepd and the jobs' processes), its namespaces and veth, and its
    nodes' empty cgroup folders when no live cluster has nodes of those names."""
    if isinstance(data.get("marker"), str):
        _kill_all(_marked_processes(data["marker"]))
    _cleanup_network(data.get("netns", []), data.get("links", []))
    nodes = data.get("nodes")
    if isinstance(nodes, list) and not _node_names_in_use(nodes, None):
        _remove_empty_cgroups(nodes)


def parse_scontrol(line: str) -> dict[str, str]:
    """`scontrol show ... -o` output (Key=Value Key2=Value with spaces ...) into a dict. Keys may hold / and :."""
    matches = list(re.finditer(r"(?:^|\s)([A-Za-z][\w/:.]*)=", line.strip()))
    info: dict[str, str] = {}
    text = line.strip()
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        info[match.group(1)] = text[match.end():end].strip()
    return info


# ----------------------------------------------------------------------------------------------------- cluster
class SlurmCluster:
    """A SLURM cluster of one or two CPU nodes on this host, for tests. Use as a context manager, or call
    start() and stop() (stop is idempotent and also registered with atexit).

    Config choices (see _slurm_conf):
      * ProctrackType=proctrack/cgroup where the cgroup v1 freezer hierarchy is mounted and writable (so on this
        project's machines: hybrid cgroup v1, and Debian builds slurmd with one cgroup folder per node name,
        slurm_<node>, so two slurmds on one host do not share one); else proctrack/linuxproc (cgroup v2 needs
        systemd/dbus or delegation, which a test container lacks). proctrack= forces one.
      * TaskPlugin=task/none: the node's CPU count is made up (below), so CPU binding (task/affinity, task/cgroup
        ConstrainCores) would bind to CPUs that may not exist.
      * SlurmdParameters=config_overrides with CPUs=cpus (default 4) per node whatever nproc says: two jobs, or
        two tasks, fit on one node; select/cons_tres with CR_Core: a task holds one CPU.
      * gres_gpu=True declares GresTypes=gpu (a GPU cluster's CPU partition: nodes have no GPUs).
      * MinJobAge=3600 (finished jobs stay in `scontrol show job`), JobRequeue=1, KillWait=kill_wait (30),
        SlurmctldTimeout=10, SlurmdTimeout=30, free ports for slurmctld and slurmd, FirstJobId=N*100000+1 so
        two live clusters never share a job id (slurm cgroup folders are named by job id).
      * requeue_hold=N (default SLURM's 120) sets AuthInfo cred_expire=N: how long SLURM holds a requeued job
        (Reason=BeginTime) before it may start again, so that the last attempt's credentials have expired on
        its nodes; it is also the lifetime of a job step's credential.
      * SchedulerParameters=sched_interval=1: a job that becomes eligible (a hold ends) starts within a second,
        not at the next 60 s scheduling pass.
    """

    def __init__(
        self,
        tmp_dir: str | os.PathLike,
        nodes: int = 1,
        *,
        gres_gpu: bool = False,
        kill_wait: int = 30,
        cpus: int = 4,
        real_memory_mb: int = 4096,
        proctrack: str = "auto",
        start_timeout: float = 60.0,
        extra_conf: str = "",
        requeue_hold: int = 120,
    ) -> None:
        if nodes not in (1, 2):
            raise ValueError(f"nodes must be 1 or 2, not {nodes}")
        if proctrack not in ("auto", "cgroup", "linuxproc"):
            raise ValueError(f"proctrack must be auto, cgroup or linuxproc, not {proctrack}")
        self.dir = Path(tmp_dir).resolve()
        self.nnodes = nodes
        self.gres_gpu = gres_gpu
        self.kill_wait = kill_wait
        self.cpus = cpus
        self.real_memory_mb = real_memory_mb
        self.proctrack = _pick_proctrack() if proctrack == "auto" else f"proctrack/{proctrack}"
        self.start_timeout = start_timeout
        self.extra_conf = extra_conf
        self.requeue_hold = requeue_hold
        self.conf = self.dir / "etc" / "slurm.conf"
        self.log_dir = self.dir / "log"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        # slurmd names a Unix socket per step after SlurmdSpoolDir, and such a name may hold 108 bytes: under
        # a deep pytest tmp folder it would not fit (a batch job then fails to start), so the spool is short.
        self.spool_dir: Path | None = None
        self.controller_host = socket.gethostname().split(".")[0]
        self.index: int | None = None
        self.node_names: list[str] = []
        self.node_addrs: list[str] = []
        self.controller_addr = "127.0.0.1"
        self.ctld_port = 0
        self.slurmd_port = 0
        self._netns: list[str] = []
        self._links: list[str] = []
        self._lock: Path | None = None
        self._procs: dict[str, subprocess.Popen] = {}  # name -> daemon we started (munged, slurmctld, slurmd-X)
        self._cgroups_before: set[Path] = set()
        self._started = False
        self._stopped = False
        self.start_seconds: float | None = None
        self.stop_seconds: float | None = None
        self._marker = f"{os.getpid()}-{time.time_ns()}"

    # -------------------------------------------------------------------------------------------- public API
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def namespaces(self) -> list[str]:
        """The network namespaces this cluster made (empty for one node)."""
        return list(self._netns)

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ for a client (sbatch, srun, scontrol...) of this cluster: SLURM_CONF set, PATH with the sbin
        folders, no SLURM_* inherited from a job this process may itself run in (they would leak into the jobs)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != MARKER}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = _path()
        env.update(extra)
        return env

    def run(self, args: list[str], check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run a SLURM client command (e.g. ["scontrol", "show", "nodes"]) against this cluster."""
        env = kwargs.pop("env", None) or self.env()
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(args)} failed with status {result.returncode}: {result.stderr.strip() or result.stdout}"
            )
        return result

    def submit(self, args: list[str], cwd: str | os.PathLike | None = None, env_extra: dict | None = None) -> int:
        """`sbatch --parsable ARGS` from cwd; returns the job id (raises with sbatch's stderr if refused)."""
        result = self.run(["sbatch", "--parsable", *args], check=False, cwd=cwd, env=self.env(**(env_extra or {})))
        if result.returncode != 0:
            raise SlurmClusterError(f"sbatch {' '.join(args)} failed with status {result.returncode}: "
                                    f"{result.stderr.strip()}")
        return int(result.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict: JobState, Reason, Restarts, ExitCode, NodeList, StdOut, ..."""
        result = self.run(["scontrol", "show", "job", "-o", str(job_id)])
        line = next((line for line in result.stdout.splitlines() if line.startswith("JobId=")), "")
        if not line:
            raise SlurmClusterError(f"scontrol show job {job_id} printed no job: {result.stdout!r}")
        return parse_scontrol(line)

    def wait_for(self, job_id: int, states: set[str] | str, timeout: float = 60, poll: float = 0.25) -> dict:
        """Poll until the job's JobState is in states; returns job(). Raises on timeout, or at once when the job
        ends in a state not asked for, with the job's info and the tail of its StdOut."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            state = info.get("JobState", "")
            if state in wanted:
                return info
            ended = state in TERMINAL_STATES
            if ended or time.monotonic() > deadline:
                why = f"ended {state}" if ended else f"still {state} after {timeout:.0f}s"
                raise SlurmClusterError(f"job {job_id} {why}, waiting for {sorted(wanted)}:\n"
                                        f"{self.describe(job_id, info)}")
            time.sleep(poll)

    def describe(self, job_id: int, info: dict | None = None) -> str:
        """Job info and its StdOut tail, for assertion messages."""
        info = info or self.job(job_id)
        keys = ("JobState", "Reason", "Restarts", "ExitCode", "NodeList", "BatchHost", "EligibleTime", "StdOut")
        out = info.get("StdOut", "")
        return (" ".join(f"{k}={info.get(k)}" for k in keys)
                + f"\n--- {out} (tail):\n" + (_tail(Path(out)) if out else "(no StdOut)")
                + self.daemon_lines(job_id))

    def daemon_lines(self, job_id: int, lines: int = 12) -> str:
        """The daemons' last log lines about a job, to tell why SLURM ended it (a launch it refused leaves
        nothing in the job's own log)."""
        shown = []
        for path in sorted(self.log_dir.glob("*.log")):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            found = [line[:200] for line in text.splitlines() if re.search(rf"\b{job_id}\b", line)]
            if found:
                shown.append(f"--- {path.name}, lines naming job {job_id} (last {lines}):\n"
                             + "\n".join(found[-lines:]))
        return "".join(f"\n{block}" for block in shown)

    def release(self, job_id: int) -> None:
        """`scontrol update jobid=N StartTime=now`. After a requeue SLURM keeps the job PENDING with
        Reason=BeginTime for requeue_hold seconds (120 by default: its EligibleTime is set that far ahead); this
        starts it at once, as an administrator could."""
        self.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"])

    def signal_batch(self, job_id: int, sig: str = "TERM") -> None:
        """`scancel --signal=SIG --batch N`: the signal to the batch shell only (see the self-test for what else)."""
        self.run(["scancel", f"--signal={sig}", "--batch", str(job_id)])

    def requeue(self, job_id: int) -> None:
        """`scontrol requeue N` (the job must have been submitted requeueable; JobRequeue=1 makes that default)."""
        self.run(["scontrol", "requeue", str(job_id)])

    def cancel(self, job_id: int, sig: str | None = None) -> None:
        """`scancel N` (with sig: `scancel --signal=SIG N`, which signals the job's steps but does not end it)."""
        self.run(["scancel", *([f"--signal={sig}"] if sig else []), str(job_id)])

    def jobs(self) -> list[int]:
        """Ids of the jobs the controller still holds as pending, running, suspended or completing."""
        result = self.run(["squeue", "-h", "-o", "%i", "-t", "PD,R,S,CG,CF,RQ,RS,SE,SO,ST"], check=False)
        return [int(x) for x in result.stdout.split() if x.isdigit()]

    def node_pid(self, node: str) -> int:
        """PID of a node's slurmd: `nsenter -t PID -n -u -m bash` opens a shell on that node."""
        return self._procs[f"slurmd-{node}"].pid

    def daemon_pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self._procs.items()}

    def owned_processes(self) -> list[tuple[int, int]]:
        """(pid, start time) of every live process this cluster's daemons are or started (slurmstepd, job tasks),
        found by a marker in the daemons' environment and the process tree below them, never by name."""
        return _marked_processes(self._marker, [p.pid for p in self._procs.values() if p.poll() is None])

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of each daemon's log; also of its stdout/stderr (<name>.out, which repeats the log
        from the moment the log file is open) where the daemon has exited or wrote no log."""
        files = sorted(self.log_dir.glob("*")) if self.log_dir.exists() else []
        shown = []
        for path in files:
            proc = self._procs.get(path.stem)
            if path.suffix == ".out" and path.with_suffix(".log").exists() and proc and proc.poll() is None:
                continue
            shown.append(f"===== {path.name}\n{_tail(path, lines)}")
        return "\n".join(shown)

    # ----------------------------------------------------------------------------------------------- start
    def start(self) -> SlurmCluster:
        if self._started:
            return self
        for reason in (ensure_slurm(), ensure_netns() if self.nnodes > 1 else None):
            if reason:
                raise SlurmClusterError(reason)
        began = time.monotonic()
        self._started = True
        atexit.register(self.stop)
        try:
            self._prepare()
            self._start_daemons()
            self._wait_idle()
        except BaseException as error:
            tails = self.log_tails()
            self.stop()
            if isinstance(error, SlurmClusterError):
                raise SlurmClusterError(f"{error}\n{tails}") from None
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _reserve_index(self) -> None:
        """Take the lowest free index N (10.233.N.0/24, namespaces slurm-cN-*, FirstJobId) by creating its lock
        file; first clean up after the runs whose lock file outlived their process (killed before stop())."""
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        for lock in LOCK_DIR.glob("*.json"):
            try:
                data = json.loads(lock.read_text())
            except (OSError, ValueError):
                continue  # being written right now by another cluster
            if isinstance(data, dict) and not _lock_owner_alive(data):
                _cleanup_stale(data)
                lock.unlink(missing_ok=True)
        me = {"pid": os.getpid(), "start": _start_time(os.getpid()), "dir": str(self.dir), "marker": self._marker}
        for index in range(1, 251):
            lock = LOCK_DIR / f"{index}.json"
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            with os.fdopen(fd, "w") as out:
                json.dump(me, out)
            self.index, self._lock = index, lock
            return
        raise SlurmClusterError(f"no free cluster index in {LOCK_DIR} (250 clusters live?)")

    def _write_lock(self) -> None:
        if self._lock is not None:
            data = {"pid": os.getpid(), "start": _start_time(os.getpid()), "dir": str(self.dir),
                    "marker": self._marker, "nodes": self.node_names, "netns": self._netns, "links": self._links}
            self._lock.write_text(json.dumps(data))

    def _prepare(self) -> None:
        self._reserve_index()
        if self.spool_dir is not None:
            shutil.rmtree(self.spool_dir, ignore_errors=True)
        self.spool_dir = Path(tempfile.mkdtemp(prefix="slurm-spool-"))
        for sub in ("etc", "munge", "state", "log", "run"):
            # A folder used before: a fresh cluster all the same (old job state would come back, and SLURM
            # refuses state saved under another ClusterName).
            if sub != "munge" and (self.dir / sub).is_dir():
                shutil.rmtree(self.dir / sub)
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.munge_socket.unlink(missing_ok=True)
        key = self.dir / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.ctld_port = _free_port()
        self.slurmd_port = _free_port()
        if self.nnodes == 1:
            self.node_names = [self.controller_host]
            self.node_addrs = ["127.0.0.1"]
            self.controller_addr = "127.0.0.1"
        else:
            self.node_names = [f"slurm-node{i}" for i in range(1, self.nnodes + 1)]
            self.node_addrs = [f"{SUBNET_PREFIX}.{self.index}.{10 + i}" for i in range(1, self.nnodes + 1)]
            self.controller_addr = f"{SUBNET_PREFIX}.{self.index}.1"
            self._make_network()
        self._cgroups_before = set(_cgroup_dirs(self.node_names))
        self._write_lock()
        self.conf.write_text(self._slurm_conf())
        (self.conf.parent / "cgroup.conf").write_text(
            "# slurm_cluster.py: only process tracking, no resource limits\n"
            "CgroupPlugin=autodetect\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n"
        )
        if self.gres_gpu:
            (self.conf.parent / "gres.conf").write_text("# slurm_cluster.py: GresTypes=gpu, and no node has one\n")
        hosts = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        if self.nnodes > 1:
            hosts.append(f"{self.controller_addr} {self.controller_host}")
            hosts += [f"{addr} {name}" for addr, name in zip(self.node_addrs, self.node_names, strict=True)]
        (self.dir / "etc" / "hosts").write_text("\n".join(hosts) + "\n")

    def _make_network(self) -> None:
        n = self.index
        hub, host_link = f"slurm-c{n}-hub", f"slc{n}-h"

        def ip(*args: str) -> None:
            result = subprocess.run(["ip", *args], capture_output=True, text=True)
            if result.returncode != 0:
                raise SlurmClusterError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")

        _cleanup_network([hub] + [f"slurm-c{n}-{name}" for name in self.node_names], [host_link])  # a stale one
        ip("netns", "add", hub)
        self._netns.append(hub)
        self._write_lock()
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "link", "set", "br0", "up")
        ip("link", "add", host_link, "type", "veth", "peer", "name", "host", "netns", hub)
        self._links.append(host_link)
        self._write_lock()
        _disable_ipv6(host_link)
        ip("addr", "add", f"{self.controller_addr}/24", "dev", host_link)
        ip("link", "set", host_link, "up")
        ip("-n", hub, "link", "set", "host", "master", "br0", "up")
        for name, addr in zip(self.node_names, self.node_addrs, strict=True):
            netns = f"slurm-c{n}-{name}"
            ip("netns", "add", netns)
            self._netns.append(netns)
            self._write_lock()
            port = name.replace("slurm-", "")
            ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
            ip("-n", hub, "link", "set", port, "master", "br0", "up")
            ip("-n", netns, "link", "set", "lo", "up")
            ip("-n", netns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", netns, "link", "set", "eth0", "up")

    def _slurm_conf(self) -> str:
        d = self.dir
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={self.cpus} Boards=1 SocketsPerBoard=1 "
            f"CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory={self.real_memory_mb} State=UNKNOWN"
            for name, addr in zip(self.node_names, self.node_addrs, strict=True)
        )
        return f"""# Written by tests/slurm_cluster.py for a throw-away test cluster; see that file's docstrings.
ClusterName=testcluster
SlurmctldHost={self.controller_host}({self.controller_addr})
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire={self.requeue_hold}
StateSaveLocation={d}/state
SlurmdSpoolDir={self.spool_dir}/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# {self.proctrack}: see the class docstring of SlurmCluster (cgroup v1 freezer where mounted, else linuxproc)
ProctrackType={self.proctrack}
TaskPlugin=task/none
# The node's CPUs below are declared, not probed: config_overrides accepts them whatever nproc says.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
PriorityType=priority/basic
MpiDefault=none
LaunchType=launch/slurm
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MinJobAge=3600
JobRequeue=1
KillWait={self.kill_wait}
InactiveLimit=0
WaitTime=0
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=10
FirstJobId={self.index * 100000 + 1}
{"GresTypes=gpu" if self.gres_gpu else "# no GresTypes: a cluster that knows no GPUs"}
{self.extra_conf}
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""

    def _daemon_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update(SLURM_CONF=str(self.conf), PATH=_path(), **{MARKER: self._marker})
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        out = open(self.log_dir / f"{name}.out", "ab")  # noqa: SIM115 - Popen hands it to the daemon
        try:
            proc = subprocess.Popen(
                args, env=self._daemon_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.dir, start_new_session=True, preexec_fn=_pdeathsig,
            )
        finally:
            out.close()
        self._procs[name] = proc
        return proc

    def _start_daemons(self) -> None:
        munge_dir = self.munge_socket.parent
        # --force: munged refuses a socket folder that not everyone can enter (pytest's tmp folders are 0700);
        # only root uses this one.
        self._spawn("munged", [
            "munged", "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={munge_dir / 'munge.key'}", f"--pid-file={self.dir / 'run' / 'munged.pid'}",
            f"--log-file={self.log_dir / 'munged.log'}", f"--seed-file={munge_dir / 'munged.seed'}",
        ])
        self._wait(lambda: self.munge_socket.exists(), 15, "munged to create its socket", ["munged"])
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        hosts = self.dir / "etc" / "hosts"
        for name in self.node_names:
            slurmd = ["slurmd", "-D", "-f", str(self.conf), "-N", name]
            if self.nnodes == 1:
                self._spawn(f"slurmd-{name}", slurmd)
                continue
            # nsenter keeps this PID (no --pid namespace, so no fork); unshare without --fork and sh's exec too,
            # so the PID Popen returns is slurmd's own.
            script = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
            self._spawn(f"slurmd-{name}", [
                "nsenter", f"--net=/run/netns/slurm-c{self.index}-{name}", "--",
                "unshare", "--uts", "--mount", "--propagation", "private", "--",
                "sh", "-c", script, "sh", name, str(hosts), *slurmd,
            ])

    def _wait(self, ready, timeout: float, what: str, daemons: list[str]) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name in daemons:
                proc = self._procs.get(name)
                if proc is not None and proc.poll() is not None:
                    raise SlurmClusterError(f"{name} exited with status {proc.returncode} while waiting for {what}")
            if time.monotonic() > deadline:
                raise SlurmClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def node_states(self) -> dict[str, str]:
        result = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=15)
        states = {}
        for line in result.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def _wait_idle(self) -> None:
        def idle() -> bool:
            states = self.node_states()
            return all(states.get(name) == "idle" for name in self.node_names)

        self._wait(idle, self.start_timeout, f"sinfo to show {', '.join(self.node_names)} idle", list(self._procs))

    # ------------------------------------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Cancel the jobs left (up to 5 s for them to end), stop the daemons this cluster started (by PID:
        SIGTERM, then SIGKILL after 10 s), SIGKILL what they left (slurmstepd, tasks: found by marker and
        process tree, never by name), delete the namespaces and veth, the empty cgroup folders (see the module
        docstring), and its lock file. Safe to call twice; registered with atexit by start()."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        began = time.monotonic()
        with contextlib.suppress(Exception):  # the controller may be dead already; the rest must still run
            self._cancel_jobs()
        leftovers = self.owned_processes()
        # What the jobs left after the grace (slurmstepd and its tasks) goes first: a slurmd that still has
        # steps takes over 10 s to stop on SIGTERM. slurmctld's own child (slurmscriptd) stays for its parent.
        daemons = {proc.pid for proc in self._procs.values()}
        ctld = self._procs.get("slurmctld")
        _kill_all([(pid, start) for pid, start in leftovers
                   if pid not in daemons and (ctld is None or _parent(pid) != ctld.pid)])
        slurmds = [name for name in self._procs if name.startswith("slurmd-")]
        for group in (slurmds, ["slurmctld"], ["munged"]):  # munged last: the others talk to it while stopping
            procs = [self._procs[name] for name in group if name in self._procs]
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        _kill_all(leftovers + self.owned_processes())
        _cleanup_network(self._netns, self._links)
        # SLURM's cgroup folders of these node names (slurm_<node>): the empty ones go, unless a live cluster
        # with the same node names may be using them; then only those this cluster added.
        keep = self._cgroups_before if _node_names_in_use(self.node_names, self._lock) else set()
        _remove_empty_cgroups(self.node_names, keep)
        if self.spool_dir is not None:
            shutil.rmtree(self.spool_dir, ignore_errors=True)
        if self._lock is not None:
            self._lock.unlink(missing_ok=True)
        atexit.unregister(self.stop)
        self.stop_seconds = time.monotonic() - began

    def _cancel_jobs(self, grace: float = 5.0) -> None:
        """scancel every job left and give them up to grace seconds to end (SIGTERM, KillWait, SIGKILL from
        SLURM). What still runs then is SIGKILLed by stop(): a task that ignores SIGTERM with KillWait=30
        would otherwise hold stop() for 30 s, and `scancel --signal=KILL` does nothing to a cancelled job."""
        if self._procs.get("slurmctld") is None or self._procs["slurmctld"].poll() is not None:
            return
        ids = self.jobs()
        if not ids:
            return
        self.run(["scancel", *map(str, ids)], check=False, timeout=15)
        deadline = time.monotonic() + grace
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.25)


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _disable_ipv6(link: str) -> None:
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1")


def _pick_proctrack() -> str:
    """proctrack/cgroup where SLURM's cgroup/v1 plugin can work: the freezer hierarchy mounted and writable;
    else proctrack/linuxproc (cgroup v2 would need systemd/dbus or a delegated subtree)."""
    freezer = Path("/sys/fs/cgroup/freezer")
    if (freezer / "cgroup.procs").exists() and os.access(freezer, os.W_OK):
        return "proctrack/cgroup"
    return "proctrack/linuxproc"


# --------------------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A throw-away SLURM cluster on this host, for trying scripts.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster, print how to use it, stop it on Ctrl-C or SIGTERM")
    up.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    up.add_argument("--dir", required=True, help="folder for everything the cluster writes")
    up.add_argument("--gres-gpu", action="store_true", help="declare GresTypes=gpu (nodes still have none)")
    up.add_argument("--kill-wait", type=int, default=30)
    up.add_argument("--cpus", type=int, default=4, help="CPUs declared per node")
    args = parser.parse_args(argv)
    reason = ensure_slurm() or (ensure_netns() if args.nodes > 1 else None)
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    cluster = SlurmCluster(args.dir, nodes=args.nodes, gres_gpu=args.gres_gpu, kill_wait=args.kill_wait,
                           cpus=args.cpus)
    try:
        cluster.start()
        print(f"SLURM cluster up in {cluster.start_seconds:.1f}s: nodes {', '.join(cluster.node_names)}")
        print(f"export SLURM_CONF={cluster.conf}")
        for name in cluster.node_names if args.nodes > 1 else []:
            print(f"# a shell on {name}: nsenter -t {cluster.node_pid(name)} -n -u -m bash")
        print(f"# logs: {cluster.log_dir}; Ctrl-C stops the cluster", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        if cluster.stop_seconds is not None:
            print(f"stopped in {cluster.stop_seconds:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
