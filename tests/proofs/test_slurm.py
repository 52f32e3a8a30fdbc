"""scripts/train_slurm.sbatch under a real SLURM: training, two nodes, preemption and requeue.

One cluster serves the module: Debian's slurm-wlm with munge, slurmctld and two slurmd on this host,
each node in a network and UTS namespace of its own (tests/slurm_cluster.py). Jobs run the unchanged
script as a user submits it to a CPU partition:

    NPROC_PER_NODE=2 sbatch --gpus-per-node=0 scripts/train_slurm.sbatch CONFIG --flag value ...

Each stop is made the way a cluster makes it: `scancel --signal=TERM --batch` (what
`#SBATCH --signal=B:TERM@120` does before a time limit), SLURM's own time limit, and `scontrol requeue`
(what preemption with PreemptMode=REQUEUE does). After a requeue SLURM holds the job until the last
attempt's credentials have expired (AuthInfo cred_expire, 120 s by default) and then starts it again by
itself; this cluster sets that hold to REQUEUE_HOLD seconds. Loader workers are on
(--dataloader_num_workers 1): SLURM signals them too.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import IS_NATIVE, PACKAGE, REPO_ROOT, TRAIN_SIZE, package_module, run_env, smoke_flags
from no_dropout import copy_without_dropout
from safetensors.torch import load_file
from slurm_cluster import SlurmCluster, require_netns, require_slurm
from warm_launch import torchrun

pytestmark = pytest.mark.slurm

SCRIPT = str(REPO_ROOT / "scripts" / "train_slurm.sbatch")
SIMULATION = REPO_ROOT / "tests" / "simulated_gpu_node"
EPOCHS = 4
STEPS = EPOCHS * TRAIN_SIZE // (2 * 16)  # 2 processes x per-device batch 16 (configs/smoke.yaml)
# Long enough that a stop lands in mid-run; a checkpoint each epoch, and loader workers.
FLAGS = ["--num_train_epochs", str(EPOCHS), "--save_strategy", "epoch", "--dataloader_num_workers", "1",
         "--logging_steps", "4"]
# Seconds SLURM holds a requeued job before it starts again (cred_expire; 120 by default): long enough
# for a step's credential, which lives as long, to reach its nodes on a busy machine.
REQUEUE_HOLD = 10
WEIGHTS_ATOL = 1e-6  # as tests/test_preemption.py: the same operations in the same order


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require_slurm(nodes=2)
    require_netns()
    with SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=2, requeue_hold=REQUEUE_HOLD) as running:
        yield running


class Job:
    """One sbatch submission of the script, its log file and output_dir."""

    def __init__(self, cluster: SlurmCluster, folder: Path, nodes: int, flags: list[str],
                 sbatch: tuple[str, ...] = (), **env: str) -> None:
        self.cluster, self.output_dir, self.log = cluster, folder / "out", folder / "job.out"
        folder.mkdir(parents=True, exist_ok=True)  # for the log: SLURM creates the file, not its folder
        env = run_env(**{"NPROC_PER_NODE": str(2 // nodes), **env})
        args = ["--nodes", str(nodes), "--gpus-per-node=0", "--output", str(self.log), *sbatch, SCRIPT, *flags]
        self.id = cluster.submit(args, cwd=REPO_ROOT, env_extra={k: v for k, v in env.items() if k != "PATH"})

    def text(self) -> str:
        return self.log.read_text() if self.log.is_file() else ""

    def wait_for_log(self, pattern: str, timeout: float = 240) -> float:
        """Wait until the log matches; returns the time it did."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text()):
            if time.monotonic() > deadline:
                pytest.fail(f"{pattern!r} never appeared:\n{self.cluster.describe(self.id)}\n{self.text()[-3000:]}")
            time.sleep(0.1)
        return time.monotonic()

    def wait_for(self, states: set[str], timeout: float = 300) -> dict:
        return self.cluster.wait_for(self.id, states, timeout=timeout)


def weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "model.safetensors")


def assert_same_weights(output_dir: Path, reference: Path) -> float:
    ours, theirs = weights(output_dir), weights(reference)
    assert ours.keys() == theirs.keys()
    difference = max(float((ours[name] - theirs[name]).abs().max()) for name in ours)
    assert difference <= WEIGHTS_ATOL, f"max weight difference {difference}"
    return difference


@pytest.fixture(scope="module")
def reference(cluster: SlurmCluster, smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Job:
    """One node, 2 processes, not disturbed: the weights every stopped run must end with."""
    folder = tmp_path_factory.mktemp("reference")
    job = Job(cluster, folder, 1, [*smoke_flags(smoke_assets, folder / "out"), *FLAGS])
    job.info = job.wait_for({"COMPLETED"})
    return job


def test_one_node_two_processes_train_and_write_metrics_on_a_cpu_partition(reference: Job) -> None:
    log = reference.text()
    assert reference.info["Restarts"] == "0"
    assert "world size 2, device cpu, backend gloo" in log
    assert json.loads((reference.output_dir / "metrics.json").read_text())["train_steps"] == STEPS
    # No CPUs asked for: the partition's default of one per task, and the log says that no loader worker fits.
    assert "warning: 1 CPU(s) per node for 2 process(es): no data loader worker fits" in log
    # The rendezvous port comes from the job id, so that jobs sharing a node never meet.
    assert f"--rdzv-endpoint={reference.info['BatchHost']}:{15000 + reference.id % 15000}" in log


def stop_by_batch_signal(cluster: SlurmCluster, job: Job) -> None:
    cluster.signal_batch(job.id, "TERM")


def stop_by_requeue(cluster: SlurmCluster, job: Job) -> None:
    cluster.requeue(job.id)


def stop_by_time_limit(cluster: SlurmCluster, job: Job) -> None:
    # A limit 2 minutes after the whole minutes the job has run puts the script's --signal=B:TERM@120 due now;
    # slurmctld sends it at its next time-limit check, up to 30 s later (measured here: 18-26 s). The limit
    # itself is then at least a minute away, so the training has time to save before SLURM ends the job
    # (TIMEOUT, not requeued). A fixed 2 put that end at or just after the signal when the first epoch was slow.
    minutes = run_minutes(cluster.job(job.id)["RunTime"])
    cluster.run(["scontrol", "update", f"jobid={job.id}", f"TimeLimit={minutes + 2}"])


def run_minutes(run_time: str) -> int:
    """The whole minutes of scontrol's RunTime, [D-]HH:MM:SS."""
    days, _, clock = run_time.rpartition("-")
    hours, minutes, _ = (int(part) for part in clock.split(":"))
    return (int(days or 0) * 24 + hours) * 60 + minutes


STOPS = {"batch signal": stop_by_batch_signal, "time limit": stop_by_time_limit, "scontrol requeue": stop_by_requeue}


def run_stopped(cluster: SlurmCluster, folder: Path, assets: Path, nodes: int, stop: Callable,
                flags: list[str] = FLAGS, **env: str) -> Job:
    """A job stopped once it wrote its first checkpoint, requeued, started again by SLURM, and finished."""
    job = Job(cluster, folder, nodes, [*smoke_flags(assets, folder / "out"), *flags], sbatch=("--cpus-per-task=2",),
              **env)
    wait_for_first_checkpoint(job)
    signalled = time.monotonic()
    stop(cluster, job)
    job.stop_seconds = job.wait_for_log(r"torchrun: stopped by SIGTERM", timeout=120) - signalled
    job.wait_for({"PENDING"}, timeout=120)
    cluster.run(["scontrol", "update", f"jobid={job.id}", "TimeLimit=10"])  # the first attempt's limit, restored
    # SLURM holds the requeued job REQUEUE_HOLD seconds, for the last attempt to end on its nodes, and then
    # starts it by itself.
    job.info = job.wait_for({"COMPLETED"}, timeout=REQUEUE_HOLD + 120)
    return job


def wait_for_first_checkpoint(job: Job, timeout: float = 240) -> None:
    first = f"checkpoint-{STEPS // EPOCHS}"
    deadline = time.monotonic() + timeout
    while not (job.output_dir / first).is_dir():
        assert time.monotonic() < deadline, job.text()[-3000:]
        time.sleep(0.1)


@pytest.fixture(scope="module")
def stopped(cluster: SlurmCluster, smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory):
    runs: dict[tuple[str, int], Job] = {}

    def get(how: str, nodes: int) -> Job:
        if (how, nodes) not in runs:
            folder = tmp_path_factory.mktemp(f"{how.replace(' ', '_')}_{nodes}_nodes")
            runs[how, nodes] = run_stopped(cluster, folder, smoke_assets, nodes, STOPS[how])
        return runs[how, nodes]
    return get


# One node and two nodes, by the batch shell's signal and by SLURM's own requeue.
STOP_CASES = [("batch signal", 1), ("scontrol requeue", 1), ("batch signal", 2), ("scontrol requeue", 2)]


@pytest.mark.parametrize(("how", "nodes"), STOP_CASES, ids=[f"{how}, {nodes} node(s)" for how, nodes in STOP_CASES])
def test_a_stopped_job_saves_is_requeued_once_resumes_there_and_ends_with_the_undisturbed_weights(
    stopped, reference: Job, how: str, nodes: int
) -> None:
    check_stopped_run(stopped(how, nodes), reference.output_dir, how, nodes, STEPS)


# SLURM's own time limit signals up to 30 s after it is due, so its job must still train then: 20 epochs with
# a pause of STEP_PAUSE s after each step (tests/slow_steps.py) last over a minute on any machine, with the
# CPU left to the other tests. The undisturbed reference trains the same steps without the pauses, which
# change nothing it computes (warm: tests/conftest.py's torchrun). It costs a minute and a half, so it runs in
# the Trainer project (the default loop) alone; the path it adds (SLURM signalling the batch shell before the
# limit) is the loop's business nowhere.
LONG_EPOCHS = 20
LONG_FLAGS = [*FLAGS, "--num_train_epochs", str(LONG_EPOCHS), "--save_total_limit", "1"]
STEP_PAUSE = 0.4
if not IS_NATIVE:

    def test_a_real_time_limit_stops_saves_requeues_and_resumes_with_the_undisturbed_weights(
        cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
    ) -> None:
        reference = tmp_path / "reference"
        torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(smoke_assets, reference), *LONG_FLAGS])
        job = run_stopped(cluster, tmp_path / "limited", smoke_assets, 1, stop_by_time_limit, LONG_FLAGS,
                          MODULE="slow_steps", STEP_PAUSE=str(STEP_PAUSE), PYTHONPATH=str(REPO_ROOT / "tests"))
        check_stopped_run(job, reference, "time limit", 1, LONG_EPOCHS * STEPS // EPOCHS)


def attempts(log: str) -> list[int]:
    """The attempt numbers of the header lines the script writes at each start of the job."""
    return [int(n) for n in re.findall(r"^=== job \d+, attempt (\d+)", log, re.MULTILINE)]


if IS_NATIVE and hasattr(package_module("parallel"), "shard_model"):  # rendered with FSDP

    def test_an_fsdp_job_on_two_nodes_is_requeued_resumes_its_shards_and_ends_with_the_undisturbed_weights(
        cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
    ) -> None:
        """--fsdp across two nodes: each rank writes its shards, and the requeued job reads them back."""
        flags = [*FLAGS, "--fsdp", "true"]
        reference = tmp_path / "reference"
        torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(smoke_assets, reference), *flags])
        job = run_stopped(cluster, tmp_path / "requeued", smoke_assets, 2, stop_by_requeue, flags)
        assert job.text().count("FSDP: 2 FSDPBertLayer blocks and the root sharded over 2 ranks") == 2  # per attempt
        check_stopped_run(job, reference, "scontrol requeue", 2, STEPS)


def resumed_steps(log: str) -> list[int]:
    """The steps the log says the run resumed from (each loop's line)."""
    resumed = r"resumed from \S+checkpoint-(\d+) at step" if IS_NATIVE else r"resuming from checkpoint \S+-(\d+)"
    return [int(step) for step in re.findall(resumed, log)]


def check_stopped_run(job: Job, reference: Path, how: str, nodes: int, steps: int) -> None:
    log = job.text()
    assert job.info["JobState"] == "COMPLETED" and job.info["Restarts"] == "1"
    assert attempts(log) == [1, 2]
    saved = [int(step) for step in re.findall(r"stopped by SIGTERM at step (\d+), saved in checkpoint-\1", log)]
    assert len(saved) == 1 and STEPS // EPOCHS <= saved[0] < steps, log[-3000:]
    assert resumed_steps(log) == saved
    # One line per node, and no traceback.
    line = f"torchrun: stopped by SIGTERM: all {2 // nodes} worker(s) here saved the step they reached"
    assert log.count(line) == nodes
    assert "Traceback" not in log and "DataLoader worker" not in log, log[-3000:]
    who = "SLURM requeues job" if how == "scontrol requeue" else f"job {job.id} requeued after attempt 1"
    assert who in log
    difference = assert_same_weights(job.output_dir, reference)
    print(f"{how}, {nodes} node(s): signal to exit {job.stop_seconds:.1f} s, saved step {saved[0]}, "
          f"resumed at {saved[0]}, max weight difference {difference:g}")


# A job preempted on 2 nodes x 1 process waits in the queue while an administrator short of nodes drains node 2
# and cuts the job to one node (`scontrol update jobid=N NumTasks=1 NumNodes=1-1`). Its next attempt's
# SLURM_NNODES and node list are the new allocation's, but SLURM_NTASKS is still the submission's 2: srun must
# ask for this attempt's nodes, or SLURM refuses the step ("More processors requested than permitted").
DRAINED = "slurm-node2"


def run_cut_to_one_node(cluster: SlurmCluster, folder: Path, assets: Path, ends: str) -> Job:
    """A 2-node job requeued by SLURM once it wrote its first checkpoint, cut to one node while it waits, and
    started again there by SLURM; it ends in the state `ends`. Node 2 is back in service afterwards."""
    job = Job(cluster, folder, 2, [*smoke_flags(assets, folder / "out"), *FLAGS], sbatch=("--cpus-per-task=2",))
    try:
        wait_for_first_checkpoint(job)
        # Drained before the requeue: the job keeps the node until it ends, and then cannot start on 2 nodes
        # again, however long the update below takes.
        cluster.run(["scontrol", "update", f"nodename={DRAINED}", "state=drain", "reason=short of nodes"])
        stop_by_requeue(cluster, job)
        job.wait_for_log(r"torchrun: stopped by SIGTERM", timeout=120)
        job.wait_for({"PENDING"}, timeout=120)
        cluster.run(["scontrol", "update", f"jobid={job.id}", "NumTasks=1", "NumNodes=1-1"])
        job.info = job.wait_for({ends}, timeout=REQUEUE_HOLD + 120)
    finally:
        if job.id in cluster.jobs():  # a failed wait: it must not come back on the node resumed below
            cluster.cancel(job.id)
        cluster.run(["scontrol", "update", f"nodename={DRAINED}", "state=resume"])
    return job


def check_cut_to_one_node(job: Job) -> int:
    """What both loops show: one save on 2 nodes, then one task on the one node left. Returns the saved step."""
    log = job.text()
    assert job.info["Restarts"] == "1" and job.info["NodeList"] == "slurm-node1", job.info
    assert attempts(log) == [1, 2]
    assert f"SLURM requeues job {job.id} itself" in log
    assert log.count("torchrun: stopped by SIGTERM: all 1 worker(s) here saved the step they reached") == 2
    saved = [int(step) for step in re.findall(r"stopped by SIGTERM at step (\d+), saved in checkpoint-\1", log)]
    assert len(saved) == 1 and STEPS // EPOCHS <= saved[0] < STEPS, log[-3000:]
    # Each attempt's srun and torchrun ask for the nodes that attempt holds.
    launches = re.findall(r"^\+ srun --nodes=(\d+) --ntasks=(\d+) .* --nnodes=(\d+) ", log, re.MULTILINE)
    assert launches == [("2", "2", "2"), ("1", "1", "1")], log[-3000:]
    assert "Unable to create step" not in log and "can't honor --ntasks-per-node" not in log, log[-3000:]
    return saved[0]


def test_a_requeued_job_cut_to_one_node_resumes_there_and_keeps_the_global_batch_and_the_weights(
    cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
) -> None:
    # Dropout off: resumed on another world size, each process draws fresh dropout streams, so with dropout
    # the runs would differ by their masks, not by how they split the batch.
    assets = copy_without_dropout(smoke_assets, tmp_path / "assets")
    # The undisturbed run, on 2 processes of this host: what 2 nodes x 1 process compute (the 2-node runs of
    # the test above end with the 1-node reference's weights), without holding the cluster's nodes.
    reference = tmp_path / "reference"
    torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(assets, reference), *FLAGS])
    job = run_cut_to_one_node(cluster, tmp_path / "job", assets, "COMPLETED")
    saved = check_cut_to_one_node(job)
    log = job.text()
    # 2 processes x batch 16 become 1 x 16 x 2 accumulation steps. Each step then adds the gradients of the
    # same two micro-batches, each halved, where the all-reduce averaged them: halving is exact in floats, and
    # two terms add alike in either order, so WEIGHTS_ATOL holds (measured here: a difference of 0).
    assert re.findall(r"world size (\d+), device", log) == ["2", "1"]
    assert "resuming a run of 2 processes on 1: 2 accumulation steps keep its global batch of 32" in log
    assert resumed_steps(log) == [saved]
    assert "Traceback" not in log and "DataLoader worker" not in log, log[-3000:]
    assert json.loads((job.output_dir / "metrics.json").read_text())["train_steps"] == STEPS
    difference = assert_same_weights(job.output_dir, reference)
    print(f"cut to one node: saved step {saved} on world size 2, resumed at {saved} on world size 1, "
          f"max weight difference {difference:g}")


def test_a_stop_before_the_training_starts_is_an_error_and_not_requeued(
    cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
) -> None:
    # NPROC_PER_NODE=auto: the script counts the (simulated) GPUs with torch before it starts srun, seconds
    # in which the stop comes.
    pythonpath = os.pathsep.join([str(SIMULATION), os.environ.get("PYTHONPATH", "")])
    job = Job(cluster, tmp_path, 1, [*smoke_flags(smoke_assets, tmp_path / "out"), *FLAGS], NPROC_PER_NODE="auto",
              SIMULATED_GPUS="2", SIMULATED_GPU_RECORD=str(tmp_path / "ranks.jsonl"), PYTHONPATH=pythonpath)
    job.wait_for_log(r"=== job \d+, attempt 1")
    cluster.signal_batch(job.id, "TERM")
    info = job.wait_for({"FAILED"}, timeout=120)
    assert info["Restarts"] == "0" and info["ExitCode"] == "1:0"
    assert job.text().rstrip().splitlines()[-1] == (
        f"error: SIGTERM came before the training started (attempt 1): nothing was saved, so job {job.id} is not "
        "requeued; resubmit it")
    assert not (tmp_path / "out").exists()


def job_with_waiting_workers(cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path) -> Job:
    """A job whose workers have started and wait before the run (tests/slow_steps.py's START_PAUSE): a stop
    then finds them before they set their SIGTERM handler, and kills them."""
    job = Job(cluster, tmp_path, 1, [*smoke_flags(smoke_assets, tmp_path / "out"), *FLAGS], MODULE="slow_steps",
              START_PAUSE="60", PYTHONPATH=str(REPO_ROOT / "tests"))
    job.wait_for_log(r"slow_steps: waiting")
    return job


def test_a_stop_while_the_workers_start_is_an_error_and_not_requeued(
    cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
) -> None:
    job = job_with_waiting_workers(cluster, smoke_assets, tmp_path)
    cluster.signal_batch(job.id, "TERM")
    info = job.wait_for({"FAILED"}, timeout=120)
    log = job.text()
    assert info["Restarts"] == "0"
    assert re.search(r"torchrun: stopped by SIGTERM, but worker\(s\) \d+ \(killed by SIGTERM\), \d+ \(killed by "
                     r"SIGTERM\) did not save the step they reached", log), log[-3000:]
    assert log.rstrip().splitlines()[-1].startswith(
        "error: the training did not save at the stop: srun ended with status 1 (see above); nothing new was saved, "
        f"so job {job.id} is not requeued")


def test_a_requeue_while_the_workers_start_is_an_error_that_says_slurm_requeues_the_job(
    cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
) -> None:
    # As above, but SLURM ends the attempt to requeue the job (scontrol requeue, as preemption does): nothing
    # was saved, and the error line says that SLURM starts the job again.
    job = job_with_waiting_workers(cluster, smoke_assets, tmp_path)
    stop_by_requeue(cluster, job)
    job.wait_for_log(r"(?m)^error: ", timeout=120)
    info = job.wait_for({"PENDING"}, timeout=120)
    cluster.cancel(job.id)  # before SLURM starts it again
    log = job.text()
    assert info["Restarts"] == "1"
    assert f"SLURM requeues job {job.id} itself" in log
    assert log.rstrip().splitlines()[-1] == (
        "error: the training did not save at the stop: srun ended with status 1 (see above); nothing new was saved, "
        f"SLURM requeues job {job.id} itself, and its next attempt resumes from the newest checkpoint, if any"
    ), log[-3000:]


def test_scancel_saves_the_step_reached_and_the_job_ends_cancelled(
    cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
) -> None:
    flags = [*smoke_flags(smoke_assets, tmp_path / "out"), *FLAGS]
    job = Job(cluster, tmp_path, 1, flags, sbatch=("--cpus-per-task=2",))
    job.wait_for_log(r'"step": 4,')
    cluster.cancel(job.id)
    info = job.wait_for({"CANCELLED"}, timeout=120)
    job.wait_for_log(r"torchrun: stopped by SIGTERM: all 2 worker\(s\) here saved", timeout=30)
    log = job.text()
    saved = re.findall(r"stopped by SIGTERM at step (\d+), saved in checkpoint-\1", log)
    assert info["Restarts"] == "0" and len(saved) == 1 and (job.output_dir / f"checkpoint-{saved[0]}").is_dir()
    assert f"job {job.id} is ending (COMPLETING, e.g. scancel); the training saves the step it reached" in log


def test_auto_on_a_node_whose_job_sees_4_gpus_starts_4_ranks_on_nccl(
    cluster: SlurmCluster, smoke_assets: Path, tmp_path: Path
) -> None:
    # The GPUs are simulated (tests/simulated_gpu_node): the cluster has none, so the job asks for none;
    # each rank stops where NCCL would start.
    record = tmp_path / "ranks.jsonl"
    pythonpath = os.pathsep.join([str(SIMULATION), os.environ.get("PYTHONPATH", "")])
    job = Job(cluster, tmp_path, 1, [*smoke_flags(smoke_assets, tmp_path / "out"), "--mixed_precision", "auto"],
              NPROC_PER_NODE="auto", SIMULATED_GPUS="4", SIMULATED_GPU_RECORD=str(record), PYTHONPATH=pythonpath)
    job.wait_for({"COMPLETED"})
    ranks = sorted((json.loads(line) for line in record.read_text().splitlines()), key=lambda rank: rank["rank"])
    assert [(rank["rank"], rank["device_id"], rank["backend"]) for rank in ranks] == [
        (index, f"cuda:{index}", "nccl") for index in range(4)]
    assert "4 process(es) on 4 GPU(s), precision bf16" in job.text()


@pytest.mark.parametrize("gres_gpu", [False, True], ids=["cluster without GPUs", "CPU partition of a GPU cluster"])
def test_a_cpu_partition_takes_the_script_with_gpus_per_node_0(tmp_path: Path, gres_gpu: bool) -> None:
    require_slurm(nodes=1)
    with SlurmCluster(tmp_path / "slurm", nodes=1, gres_gpu=gres_gpu) as own:
        log = tmp_path / "help.out"
        job_id = own.submit(["--nodes=1", "--gpus-per-node=0", "--output", str(log), SCRIPT, "--help"], cwd=REPO_ROOT,
                            env_extra={"PYTHON": sys.executable})
        own.wait_for(job_id, {"COMPLETED"}, timeout=60)
        assert "Usage: mkdir -p logs && sbatch scripts/train_slurm.sbatch" in log.read_text()
