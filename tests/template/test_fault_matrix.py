"""No rank ever hangs: every way a worker ends, the run's processes end, data loader workers and all, so that
torchrun can recover.

Against a render of each loop: real torchrun through the project's own launch scripts, 2 processes on gloo,
2 data loader workers per rank. tests/support/fault_inject.py runs the train module and faults one rank at
its first optimizer step after a complete checkpoint (epoch 1 of 2). The cases:

- a worker SIGKILLed: the group restarts (MAX_RESTARTS=1) and ends with the undisturbed weights;
- a node lost under c10d (NNODES=1:2, one process a node, the whole launcher of one node SIGKILLed): the
  survivor re-forms the job alone and resumes with the same global batch;
- a node that joins under c10d (node 0 alone with NNODES=1:2 and 2 accumulation steps, node 1 started once
  node 0 holds after its first checkpoint): torchrun stops node 0's worker, which saves the step it
  reached, and re-forms the job with both nodes, which go on with 1 accumulation step;
- a checkpoint of 2 processes resumed on 1, and one of 1 process (2 accumulation steps) resumed on 2: the
  same global batch, split anew;
- an exception in a step on one rank: every process ends, the run exits non-zero, the error shown once;
- SIGTERM to every process of the run, as SLURM sends it: the ranks save, and the same command resumes to
  the undisturbed weights.

Where the world size changes, the weights end within RESHAPED_RTOL of the undisturbed run's, in both
loops. In every case no process of the run is left when its launcher exits, and the rank that lost its peer ends
within FAULT_TO_EXIT_SECONDS. (Before loader workers ended on their parent's SIGTERM, such a rank joined
its loader workers forever.) Each run's processes are found by a token in their environment, which
every process under the launcher inherits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.launches

SUPPORT = Path(__file__).resolve().parent.parent / "support"
TRAIN_SIZE, EVAL_SIZE = 256, 101
STEPS_PER_EPOCH = TRAIN_SIZE // (2 * 16)  # 2 ranks x the smoke config's 16 a device
FLAGS = ["--num_train_epochs", "2", "--save_strategy", "epoch", "--dataloader_num_workers", "2",
         "--disable_tqdm", "true"]
TOKEN = "FAULT_MATRIX_RUN"
# Seen here on 2 cores: a rank whose peer died ends 1-3 s after the fault, its loader workers with it. torchrun
# SIGKILLs a worker 30 s after asking it to stop: a rank that needed that would show here.
FAULT_TO_EXIT_SECONDS = 20
# A restarted run repeats the uninterrupted run's operations exactly: 0 measured.
RESTART_ATOL = 1e-6
# On 1 process with 2 accumulation steps instead of 2 processes, sums run in another order (float32
# rounding): the relative bound of the render's own world-size test.
RESHAPED_RTOL = 1e-5
LAUNCH_TIMEOUT = 300
# One process with the undisturbed run's global batch of 2 x 16.
ACCUMULATE_2 = ("--gradient_accumulation_steps", "2")


def run_pids(token: str) -> dict[int, str]:
    """The live processes whose environment holds this run's token, with their command lines."""
    marker = f"{TOKEN}={token}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def is_worker(pid: int, command: str, launchers: set[int]) -> bool:
    """A rank or one of its loader workers: a process of the run that is not a launcher. The launcher forks the
    ranks, and a rank its loader workers, so all of them have the launcher's command line."""
    return "-m fault_inject" in command and pid not in launchers


@dataclass
class Watch:
    """Every process of a run, polled each 0.1 s: when each was first and last seen alive."""

    tokens: list[str]
    launchers: set[int] = field(default_factory=set)  # the launch scripts' processes, which exec the launcher
    first_seen: dict[int, float] = field(default_factory=dict)
    last_seen: dict[int, float] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            for token in self.tokens:
                for pid, command in run_pids(token).items():
                    self.first_seen.setdefault(pid, now)
                    self.last_seen[pid] = now
                    self.commands[pid] = command
            time.sleep(0.1)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()

    def workers_ended(self, fault_time: float) -> float:
        """Seconds from the fault to the exit of the last worker (a rank or its loader workers) that was alive
        at the fault; those of a restart start after it."""
        ends = [self.last_seen[pid] for pid, command in self.commands.items() if is_worker(pid, command, self.launchers)
                and self.first_seen[pid] <= fault_time <= self.last_seen[pid] + 0.2]
        assert ends, "no worker was seen alive at the fault"
        return max(ends) - fault_time


@dataclass
class Run:
    returncodes: list[int]
    log: str
    output_dir: Path
    fault: dict | None
    left: dict[int, str]  # processes of the run alive after its launchers exited
    seconds: dict[str, float] = field(default_factory=dict)


class Project:
    """A render, its smoke assets without dropout, and its launch scripts run as a user runs them."""

    def __init__(self, root: Path, assets: Path) -> None:
        self.root, self.assets = root, assets
        self.package = next((root / "src").glob("*/__init__.py")).parent.name

    def env(self, token: str, **extra: str) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if not name.startswith(("PYTEST", "FAULT"))}
        env.update(PYTHONPATH=os.pathsep.join([str(self.root / "src"), str(SUPPORT)]), PYTHON=sys.executable,
                   OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
                   FAULT_TRAIN_MODULE=f"{self.package}.train", **{TOKEN: token}, **extra)
        return env

    def flags(self, output_dir: Path) -> list[str]:
        return ["configs/smoke.yaml", "--model_name_or_path", str(self.assets / "tiny-bert"),
                "--train_file", str(self.assets / "train.jsonl"),
                "--validation_file", str(self.assets / "validation.jsonl"), "--output_dir", str(output_dir), *FLAGS]

    def start(self, script: str, output_dir: Path, env: dict[str, str], log: Path,
              extra: tuple[str, ...] = ()) -> subprocess.Popen:
        with log.open("w") as out:
            return subprocess.Popen([str(self.root / "scripts" / script), *self.flags(output_dir), *extra],
                                    cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def fault_env(self, folder: Path, output_dir: Path, fault: str, rank: int | None, **extra: str) -> dict:
        env = dict(FAULT=fault, FAULT_MARKER=str(folder / "fault.json"), FAULT_OUTPUT_DIR=str(output_dir),
                   MODULE="fault_inject", **extra)
        if rank is not None:
            env["FAULT_RANK"] = str(rank)
        return env


def wait(processes: list[subprocess.Popen], tokens: list[str]) -> list[int]:
    """The launchers' exit statuses; on a timeout, every process of the run is killed and the test fails."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    try:
        return [process.wait(timeout=max(1.0, deadline - time.monotonic())) for process in processes]
    except subprocess.TimeoutExpired:
        kill_all(tokens)
        for process in processes:
            process.wait()
        pytest.fail(f"the run did not end within {LAUNCH_TIMEOUT} s")


def kill_all(tokens: list[str]) -> None:
    for token in tokens:
        for pid in run_pids(token):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def read_fault(folder: Path) -> dict | None:
    """The fault's record, once the rank has written it whole (it creates the file first, then writes)."""
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        return json.loads((folder / "fault.json").read_text())
    return None


def wait_for_fault(folder: Path, processes: list[subprocess.Popen], tokens: list[str]) -> dict:
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while (fault := read_fault(folder)) is None:
        if time.monotonic() > deadline or all(process.poll() is not None for process in processes):
            kill_all(tokens)
            pytest.fail(f"no rank reached the fault: {[(folder / 'node0.log').read_text()[-3000:]]}")
        time.sleep(0.05)
    return fault


def launch(project: Project, folder: Path, script: str, env: dict[str, str], extra: tuple[str, ...] = ()) -> Run:
    """One launcher on this host, run to its end."""
    token, output_dir, started = uuid.uuid4().hex, folder / "output", time.time()
    watch = Watch([token])
    process = project.start(script, output_dir, project.env(token, **env), folder / "node0.log", extra)
    watch.launchers.add(process.pid)
    returncodes = wait([process], [token])
    watch.finish()
    fault = read_fault(folder)
    run = Run(returncodes, (folder / "node0.log").read_text(), output_dir, fault, run_pids(token))
    run.seconds["launch_to_exit"] = time.time() - started
    if fault is not None and fault["time"] > started:  # not an earlier run's
        run.seconds["fault_to_exit"] = watch.workers_ended(fault["time"])
    return run


def largest_difference(expected: Path, actual: Path, relative: bool = False) -> float:
    expected_weights, actual_weights = load_file(expected), load_file(actual)
    assert expected_weights.keys() == actual_weights.keys()
    worst = 0.0
    for name, tensor in expected_weights.items():
        difference = (tensor - actual_weights[name]).abs().max()
        worst = max(worst, float(difference / tensor.abs().max() if relative else difference))
    return worst


def assert_reshaped_weights(undisturbed: Run, run: Run) -> None:
    """The run, on another world size for part of it, ends with the undisturbed run's weights."""
    worst = largest_difference(undisturbed.output_dir / "model.safetensors", run.output_dir / "model.safetensors",
                               relative=True)
    assert worst <= RESHAPED_RTOL, f"largest relative weight difference {worst:.3g}"


def wait_for_line(logs: list[Path], text: str, processes: list[subprocess.Popen], tokens: list[str]) -> float:
    """When `text` first shows in one of the logs (polled every 0.1 s)."""
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while not any(text in log.read_text() for log in logs if log.exists()):
        if time.monotonic() > deadline or all(process.poll() is not None for process in processes):
            kill_all(tokens)
            pytest.fail(f"no log shows {text!r}: {[log.read_text()[-3000:] for log in logs]}")
        time.sleep(0.1)
    return time.time()


def resumed_from(log: str) -> list[str]:
    """The checkpoints the log says the run resumed from (both loops' lines)."""
    return [Path(path).name for path in re.findall(r"resum(?:ed|ing) from (?:checkpoint )?(\S+)", log)]


class FaultMatrix:
    loop: str

    @pytest.fixture(scope="class")
    @classmethod
    def project(cls, render, tmp_path_factory: pytest.TempPathFactory) -> Project:
        root = render(tmp_path_factory.mktemp(f"render_{cls.loop}"), {"training_loop": cls.loop,
                                                                        "include_slurm": False})
        assets = tmp_path_factory.mktemp("assets")
        package = next((root / "src").glob("*/__init__.py")).parent.name
        subprocess.run([sys.executable, "-c", f"from {package}.smoke import make_smoke_assets; "
                        f"make_smoke_assets({str(assets)!r}, train_size={TRAIN_SIZE}, eval_size={EVAL_SIZE})"],
                       env={**os.environ, "PYTHONPATH": str(root / "src"), "HF_HUB_OFFLINE": "1"}, check=True)
        # No dropout: a run resumed on another world size then differs from the reference only in rounding.
        config_path = assets / "tiny-bert" / "config.json"
        config = json.loads(config_path.read_text())
        config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
        config_path.write_text(json.dumps(config))
        return Project(root, assets)

    @pytest.fixture(scope="class")
    @classmethod
    def undisturbed(cls, project: Project, tmp_path_factory: pytest.TempPathFactory) -> Run:
        return launch(project, tmp_path_factory.mktemp("undisturbed"), "train_single_node.sh",
                      {"NPROC_PER_NODE": "2"})

    @pytest.fixture(scope="class")
    @classmethod
    def killed_worker(cls, project: Project, tmp_path_factory: pytest.TempPathFactory) -> Run:
        folder = tmp_path_factory.mktemp("killed_worker")
        return launch(project, folder, "train_single_node.sh", {
            "NPROC_PER_NODE": "2", "MAX_RESTARTS": "1",
            **project.fault_env(folder, folder / "output", "kill", rank=1)})

    @pytest.fixture(scope="class")
    @classmethod
    def raised(cls, project: Project, tmp_path_factory: pytest.TempPathFactory) -> Run:
        folder = tmp_path_factory.mktemp("raised")
        return launch(project, folder, "train_single_node.sh", {
            "NPROC_PER_NODE": "2", **project.fault_env(folder, folder / "output", "raise", rank=1)})

    @pytest.fixture(scope="class")
    @classmethod
    def lost_node(cls, project: Project, tmp_path_factory: pytest.TempPathFactory) -> Run:
        """Two nodes of one process on this host under c10d (NNODES=1:2). Node 1's rank holds at the fault;
        then node 1's launcher and everything under it are SIGKILLed, as when a machine dies."""
        folder = tmp_path_factory.mktemp("lost_node")
        output_dir, tokens = folder / "output", [uuid.uuid4().hex, uuid.uuid4().hex]
        port = free_port()
        common = {"NNODES": "1:2", "NPROC_PER_NODE": "1", "MAX_RESTARTS": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(port), "RDZV_BACKEND": "c10d", "MODULE": "fault_inject"}
        faulty = project.fault_env(folder, output_dir, "hold", rank=None)  # node 1's one rank, whichever it is
        watch = Watch(tokens)
        nodes = [project.start("train_multi_node.sh", output_dir,
                               project.env(tokens[rank], NODE_RANK=str(rank), **{**common, **(faulty if rank else {})}),
                               folder / f"node{rank}.log") for rank in (0, 1)]
        watch.launchers.update(node.pid for node in nodes)
        fault = wait_for_fault(folder, nodes, tokens)
        killed_at = time.time()
        kill_all(tokens[1:])
        survivor = wait(nodes[:1], tokens)
        nodes[1].wait()
        watch.finish()
        run = Run([*survivor, nodes[1].returncode], (folder / "node0.log").read_text(), output_dir, fault,
                  {**run_pids(tokens[0]), **run_pids(tokens[1])})
        run.seconds["fault_to_exit"] = watch.workers_ended(killed_at)
        return run

    @pytest.fixture(scope="class")
    @classmethod
    def joined_node(cls, project: Project, tmp_path_factory: pytest.TempPathFactory) -> Run:
        """Node 0 alone under c10d (NNODES=1:2): one process with 2 accumulation steps. Node 1 starts once node
        0's rank holds at its first step after a checkpoint; the hold ends at the SIGTERM torchrun sends when it
        re-forms the job around the waiting node."""
        folder = tmp_path_factory.mktemp("joined_node")
        output_dir, tokens, logs = folder / "output", [uuid.uuid4().hex, uuid.uuid4().hex], []
        common = {"NNODES": "1:2", "NPROC_PER_NODE": "1", "MAX_RESTARTS": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(free_port()), "RDZV_BACKEND": "c10d", "MODULE": "fault_inject"}
        held = project.fault_env(folder, output_dir, "hold", rank=None)
        watch, nodes = Watch(tokens), []
        for rank in (0, 1):
            if rank:
                fault = wait_for_fault(folder, nodes, tokens)
                joined_at = time.time()
            logs.append(folder / f"node{rank}.log")
            env = project.env(tokens[rank], NODE_RANK=str(rank), **{**common, **({} if rank else held)})
            nodes.append(project.start("train_multi_node.sh", output_dir, env, logs[-1], ACCUMULATE_2))
            watch.launchers.add(nodes[-1].pid)
        resumed_at = wait_for_line(logs, "world size 2, device", nodes, tokens)
        returncodes = wait(nodes, tokens)
        watch.finish()
        run = Run(returncodes, "".join(log.read_text() for log in logs), output_dir, fault,
                  {**run_pids(tokens[0]), **run_pids(tokens[1])})
        run.seconds["join_to_world_size_2"] = resumed_at - joined_at
        return run

    @pytest.fixture(scope="class")
    @classmethod
    def shrunk(cls, project: Project, undisturbed: Run, tmp_path_factory: pytest.TempPathFactory) -> Run:
        """The undisturbed run's first checkpoint (2 processes) resumed by 1 process, as on fewer GPUs."""
        folder, name = tmp_path_factory.mktemp("shrunk"), f"checkpoint-{STEPS_PER_EPOCH}"
        shutil.copytree(undisturbed.output_dir / name, folder / "output" / name)
        return launch(project, folder, "train_single_node.sh", {"NPROC_PER_NODE": "1"})

    @pytest.fixture(scope="class")
    @classmethod
    def grown(cls, project: Project, tmp_path_factory: pytest.TempPathFactory) -> Run:
        """A run of 1 process with 2 accumulation steps, its first checkpoint resumed on 2 processes by the same
        command."""
        alone = launch(project, tmp_path_factory.mktemp("alone"), "train_single_node.sh", {"NPROC_PER_NODE": "1"},
                       ACCUMULATE_2)
        folder, name = tmp_path_factory.mktemp("grown"), f"checkpoint-{STEPS_PER_EPOCH}"
        shutil.copytree(alone.output_dir / name, folder / "output" / name)
        return launch(project, folder, "train_single_node.sh", {"NPROC_PER_NODE": "2"}, ACCUMULATE_2)

    @pytest.fixture(scope="class")
    @classmethod
    def stopped(cls, project: Project, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
        """SIGTERM to every process of the run (its loader workers too) while rank 1 holds mid-epoch, as
        SLURM signals a job step; then the same command again."""
        folder = tmp_path_factory.mktemp("stopped")
        output_dir, token = folder / "output", uuid.uuid4().hex
        env = {"NPROC_PER_NODE": "2", **project.fault_env(folder, output_dir, "hold", rank=1)}
        watch = Watch([token])
        process = project.start("train_single_node.sh", output_dir, project.env(token, **env), folder / "node0.log")
        watch.launchers.add(process.pid)
        fault = wait_for_fault(folder, [process], [token])
        signalled = run_pids(token)
        for pid in signalled:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        signal_time = time.time()
        Path(f"{folder / 'fault.json'}.release").touch()
        returncodes = wait([process], [token])
        watch.finish()
        run = Run(returncodes, (folder / "node0.log").read_text(), output_dir, fault, run_pids(token))
        run.seconds["signal_to_exit"] = time.time() - signal_time
        run.seconds["workers_signalled"] = sum(is_worker(pid, command, watch.launchers)
                                               for pid, command in signalled.items())
        resumed = launch(project, folder, "train_single_node.sh", env)  # the marker exists: no second fault
        return run, resumed

    # ---- a worker killed -------------------------------------------------------------------------

    def test_a_killed_worker_is_restarted_and_the_job_ends_with_the_undisturbed_weights(
            self, killed_worker: Run, undisturbed: Run) -> None:
        assert killed_worker.fault is not None, "no worker was killed: the test proves nothing"
        assert killed_worker.returncodes == [0], killed_worker.log[-4000:]
        assert resumed_from(killed_worker.log) == [f"checkpoint-{STEPS_PER_EPOCH}"], killed_worker.log[-4000:]
        worst = largest_difference(undisturbed.output_dir / "model.safetensors",
                                   killed_worker.output_dir / "model.safetensors")
        assert worst <= RESTART_ATOL, f"largest weight difference {worst:.3g}"
        assert killed_worker.seconds["fault_to_exit"] <= FAULT_TO_EXIT_SECONDS, killed_worker.seconds

    # ---- a node lost -----------------------------------------------------------------------------

    def test_a_lost_node_leaves_no_rank_waiting_for_it(self, lost_node: Run) -> None:
        assert lost_node.fault is not None, "no node was lost: the test proves nothing"
        assert "Connection closed by peer" in lost_node.log or "Connection reset by peer" in lost_node.log, \
            lost_node.log[-4000:]
        assert lost_node.seconds["fault_to_exit"] <= FAULT_TO_EXIT_SECONDS, lost_node.seconds

    def test_the_survivor_of_a_lost_node_resumes_alone_with_the_same_global_batch(
            self, lost_node: Run, undisturbed: Run) -> None:
        assert lost_node.returncodes[0] == 0, lost_node.log[-4000:]
        assert "resuming a run of 2 processes on 1: 2 accumulation steps keep its global batch of 32" \
            in lost_node.log, lost_node.log[-4000:]
        assert_reshaped_weights(undisturbed, lost_node)

    # ---- a node joins ----------------------------------------------------------------------------

    def test_a_node_that_joins_is_taken_in_and_the_job_ends_with_the_undisturbed_weights(
            self, joined_node: Run, undisturbed: Run) -> None:
        assert joined_node.fault is not None, "node 0 never held for the join: the test proves nothing"
        assert joined_node.returncodes == [0, 0], joined_node.log[-4000:]
        assert sorted(set(re.findall(r"world size (\d+), device", joined_node.log))) == ["1", "2"]
        assert "resuming a run of 1 processes on 2: 1 accumulation steps keep its global batch of 32" \
            in joined_node.log, joined_node.log[-4000:]
        assert resumed_from(joined_node.log) == [f"checkpoint-{STEPS_PER_EPOCH + 1}"], joined_node.log[-4000:]
        assert_reshaped_weights(undisturbed, joined_node)

    # ---- another world size ----------------------------------------------------------------------

    def test_a_checkpoint_resumes_on_fewer_and_on_more_processes_with_the_undisturbed_weights(
            self, shrunk: Run, grown: Run, undisturbed: Run) -> None:
        for run, processes in ((shrunk, (2, 1, 2)), (grown, (1, 2, 1))):
            assert run.returncodes == [0], run.log[-4000:]
            line = (f"resuming a run of {processes[0]} processes on {processes[1]}: {processes[2]} accumulation "
                    "steps keep its global batch of 32")
            assert line in run.log, run.log[-4000:]
            assert resumed_from(run.log) == [f"checkpoint-{STEPS_PER_EPOCH}"], run.log[-4000:]
            assert_reshaped_weights(undisturbed, run)

    # ---- an exception in a step ------------------------------------------------------------------

    def test_an_exception_in_a_step_ends_the_run_with_the_error_shown_once(self, raised: Run) -> None:
        assert raised.fault is not None, "no exception was raised: the test proves nothing"
        assert raised.returncodes[0] != 0
        assert raised.log.count("InjectedFault: fault injected into rank 1") == 1, raised.log[-4000:]
        assert raised.seconds["fault_to_exit"] <= FAULT_TO_EXIT_SECONDS, raised.seconds

    # ---- SIGTERM ---------------------------------------------------------------------------------

    def test_sigterm_to_every_process_saves_and_the_same_command_resumes_to_the_undisturbed_weights(
            self, stopped: tuple[Run, Run], undisturbed: Run) -> None:
        run, resumed = stopped
        assert run.seconds["workers_signalled"] == 6, "not 2 ranks and their 4 loader workers: nothing shown"
        assert run.returncodes == [128 + signal.SIGTERM], run.log[-4000:]
        assert "all 2 worker(s) here saved the step they reached" in run.log, run.log[-4000:]
        assert resumed.returncodes == [0], resumed.log[-4000:]
        # The signal comes in step STEPS_PER_EPOCH + 1; the ranks agree on it a step behind (stopping.py).
        assert resumed_from(resumed.log) == [f"checkpoint-{STEPS_PER_EPOCH + 2}"], resumed.log[-4000:]
        worst = largest_difference(undisturbed.output_dir / "model.safetensors",
                                   resumed.output_dir / "model.safetensors")
        assert worst <= RESTART_ATOL, f"largest weight difference {worst:.3g}"

    def test_each_case_reports_its_figures(self, request: pytest.FixtureRequest, undisturbed: Run,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
        """One JSON line a case, its times and its weights against the reference, in FAULT_MATRIX_FIGURES (a
        file path), else in fault_matrix.jsonl in pytest's temporary folder."""
        figures = Path(os.environ.get("FAULT_MATRIX_FIGURES") or tmp_path_factory.getbasetemp() / "fault_matrix.jsonl")
        reference = undisturbed.output_dir / "model.safetensors"
        with figures.open("a") as out:
            for case in ("killed_worker", "lost_node", "joined_node", "shrunk", "grown", "raised", "stopped"):
                runs = request.getfixturevalue(case)
                run = runs[-1] if isinstance(runs, tuple) else runs
                seconds = (runs[0] if isinstance(runs, tuple) else run).seconds
                assert seconds, f"{case}: no time was measured"
                weights = run.output_dir / "model.safetensors"
                out.write(json.dumps({
                    "loop": self.loop, "case": case, "returncodes": run.returncodes,
                    "seconds": {key: round(value, 2) for key, value in seconds.items()},
                    "largest_weight_difference": largest_difference(reference, weights) if weights.exists() else None,
                }) + "\n")

    # ---- nothing left ----------------------------------------------------------------------------

    @pytest.mark.parametrize("case", ["undisturbed", "killed_worker", "lost_node", "joined_node", "shrunk", "grown",
                                      "raised", "stopped"])
    def test_no_process_of_the_run_outlives_its_launcher(self, case: str, request: pytest.FixtureRequest) -> None:
        runs = request.getfixturevalue(case)
        for run in runs if isinstance(runs, tuple) else [runs]:
            assert run.left == {}, run.left


class TestNativeLoop(FaultMatrix):
    loop = "native"


class TestTrainerLoop(FaultMatrix):
    loop = "trainer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
