"""Both loops on one CUDA GPU: bf16 throughput and model-FLOPs utilisation, then half-precision checkpoints.

Run it through bench/gpu_check.sh, which finds or installs what it needs (see its --help):

    python bench/gpu_check.py [--cpu] [--rendered DIR] [--workdir DIR] [--json FILE]
    python bench/gpu_check.py --render-only DIR

1. Renders both training loops (or takes them from --rendered), writes imdb-like data
   (bench/workload.py) and a bert-base-sized BertForSequenceClassification built from a config
   (12 layers, hidden 768, vocabulary 30522), saved with save_pretrained in float32, float16 and
   bfloat16.
2. Throughput: each loop trains one epoch through its `scripts/train_single_node.sh
   configs/local_files.yaml` (the real-run settings, on local files), with 1 process, nccl, bf16.
   bench/probe/ measures it (see bench_probe.py): after the warm-up steps, the real (non-padding)
   tokens and the squared real lengths that went through the model, timed with CUDA events up to
   the last step. Model FLOPs = 6 N T + 12 L H sum(l^2): N = L (4 H^2 + 2 H I) weights in the encoder's matrix
   products, T real tokens, l each example's real length; embeddings, norms and softmax are not
   counted. MFU = model FLOPs / seconds / the GPU's dense bf16 peak (a table below, or
   PEAK_BF16_TFLOPS). Then each loop again with --torch_compile true, whose metrics.json gives the graphs
   it compiled. Targets, compiled: MFU >= 40% native, >= 35% Trainer; eager: native samples/s >= the Trainer's.
   Beside them, bench/compute_limit.py (a bare eager loop on pre-built batches of the same examples,
   1 process, bf16) measured the same way: what eager PyTorch reaches on this GPU. Then each loop
   trains again for the warm-up and PROFILE_STEPS steps under torch.profiler (see profiled): a table
   of where a step's time goes.
3. Half-precision checkpoints: each loop trains a few steps from the float16 checkpoint with
   --mixed_precision fp16 and from the bfloat16 one with --mixed_precision bf16. A run passes when
   it exits 0 with a finite train loss and saves float32 weights (the loops train fp32 weights and
   leave precision to autocast).
4. With 2 or more GPUs: each loop 20 steps with one process per GPU (NPROC_PER_NODE=auto, nccl).
5. Each loop again with --torch_compile true (step 2), if the budget leaves time for it.
6. Each loop with --fsdp true on every GPU, even one (one process then holds every shard), through a
   checkpoint and a resume from it (see sharded), if the budget leaves time for it.

--cpu runs the same logic at tiny sizes on the CPU (gloo, fp32; fp16 is CUDA-only, so the float16
checkpoint trains with --mixed_precision no there), to check the script where there is no GPU; steps 4
and 6 then run 2 processes on gloo, and --fsdp in the native loop only (the Trainer refuses it on CPU).
Every failure prints a line starting with `error:`; the exit status is 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workload import imdb_like_rows, render, save_model, smoke_module, write_jsonl

BENCH = Path(__file__).resolve().parent
LOOPS = ("native", "trainer")
# What each loop's --fsdp run leaves in checkpoint-20 last: the native loop's shards, written through
# torch.distributed.checkpoint; the Trainer's state, after its weights and optimizer gathered whole. On one
# process the native loop shards nothing: it says so, and its checkpoints are as without --fsdp.
FSDP_CHECKPOINT_FILE = {"native": "model_and_optimizer/.metadata", "trainer": "trainer_state.json"}
NATIVE_ALONE = ("--fsdp on one process: nothing to shard", "training_state.pt")
PROJECT = "text-classifier"  # the default answers' project folder
BERT_BASE = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072}
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256}
MFU_TARGETS = {"native": 0.40, "trainer": 0.35}
# Both loops' --torch_compile runs, compiling included, with a margin: 85 s with --cpu on 2 cores; guessed on cuda.
COMPILED_RUNS_SECONDS = {"cuda": 240, "cpu": 200}
# Both loops' --fsdp runs and their resumes (native only with --cpu, about 25 s on 2 cores); guessed on cuda.
SHARDED_RUNS_SECONDS = {"cuda": 150, "cpu": 60}
PROFILE_STEPS = 10  # optimizer steps profiled after the warm-up
SIZES = {  # examples, per-device batch, warm-up steps left out of the timing
    "cuda": {"model": BERT_BASE, "train": 24576, "eval": 256, "batch": 64, "warmup": 20, "half_train": 512,
             "half_steps": 16, "backend": "nccl", "precision": "bf16"},
    "cpu": {"model": TINY, "train": 256, "eval": 32, "batch": 8, "warmup": 2, "half_train": 64,
            "half_steps": 4, "backend": "gloo", "precision": "no"},
}
# Dense bf16 peak in TFLOP/s by device name, most specific first (vendor data sheets, without sparsity).
PEAK_BF16_TFLOPS = [
    (r"GB200", 2500), (r"B200", 2250), (r"B100", 1750), (r"H200 NVL", 835), (r"H200", 989), (r"GH200", 989),
    (r"H100 PCIe", 756), (r"H100 NVL", 835), (r"H100", 989), (r"H800", 989), (r"\bH20\b", 148),
    (r"A100", 312), (r"A800", 312), (r"A30\b", 165), (r"A40\b", 150), (r"A10G", 70), (r"A10\b", 125),
    (r"L40S", 362), (r"L40\b", 181), (r"L4\b", 121),
]


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def absolute(path: str) -> Path:
    return Path(path).resolve()


def peak_tflops(device_name: str) -> float | None:
    if os.environ.get("PEAK_BF16_TFLOPS"):
        return float(os.environ["PEAK_BF16_TFLOPS"])
    return next((peak for pattern, peak in PEAK_BF16_TFLOPS if re.search(pattern, device_name)), None)


def projects_from(args: argparse.Namespace, workdir: Path) -> dict[str, Path]:
    if args.rendered is None:
        return {loop: render(workdir / "render" / loop, training_loop=loop, include_fsdp="yes") for loop in LOOPS}
    projects = {loop: args.rendered / loop / PROJECT for loop in LOOPS}
    missing = [str(path) for path in projects.values() if not (path / "scripts" / "train_single_node.sh").is_file()]
    if missing:
        raise SystemExit(f"error: --rendered {args.rendered}: no rendered project at {', '.join(missing)}; "
                         "make them with bench/gpu_check.sh --render-only DIR")
    return projects


def stored_dtypes(model_dir: Path) -> set[str]:
    """The tensor dtypes in a save_pretrained folder's safetensors files, read from their headers."""
    dtypes = set()
    for path in model_dir.glob("*.safetensors"):
        with path.open("rb") as file:
            header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
        dtypes |= {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    return dtypes


def write_assets(project: Path, data: Path, sizes: dict) -> None:
    smoke = smoke_module(project)
    write_jsonl(data / "train.jsonl", imdb_like_rows(smoke, sizes["train"], 0, max_words=1000))
    write_jsonl(data / "half_train.jsonl", imdb_like_rows(smoke, sizes["half_train"], 1, max_words=1000))
    write_jsonl(data / "validation.jsonl", imdb_like_rows(smoke, sizes["eval"], 2, max_words=1000))
    for dtype, stored in (("float32", "F32"), ("float16", "F16"), ("bfloat16", "BF16")):
        save_model(smoke, data / f"model-{dtype}", sizes["model"], seed=0, dtype=dtype)
        if stored_dtypes(data / f"model-{dtype}") != {stored}:  # else the half-precision runs prove nothing
            raise SystemExit(f"error: the {dtype} checkpoint holds {stored_dtypes(data / f'model-{dtype}')}, "
                             f"not {stored} only")


def train(project: Path, run_dir: Path, flags: list[str], warmup: int,
          **env_overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHON=sys.executable, NPROC_PER_NODE="1", PYTHONPATH=str(BENCH / "probe"),
               BENCH_PROBE_DIR=str(run_dir / "probe"), BENCH_PROBE_WARMUP_STEPS=str(warmup),
               HF_HOME=str(run_dir / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.update(env_overrides)  # NPROC_PER_NODE too
    # The project's config for a real run on local files (older renders: the default one).
    config = next(name for name in ("configs/local_files.yaml", "configs/default.yaml") if (project / name).is_file())
    command = [str(project / "scripts" / "train_single_node.sh"), config,
               "--output_dir", str(run_dir / "output"), "--disable_tqdm", "true", *flags]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    return result, time.perf_counter() - start


def last_error(result: subprocess.CompletedProcess) -> str:
    """The line that says what went wrong: the loop's own `error:` line, else the last exception."""
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    own = [line for line in lines if line.startswith("error:")]
    raised = [line for line in lines
              if re.match(r"\w+(\.\w+)*(Error|Exception)\b", line) and "ChildFailedError" not in line]
    return (own or raised or lines or ["no output"])[-1][:300]


def throughput(loop: str, project: Path, data: Path, workdir: Path, sizes: dict, device: str, peak: float | None,
               compiled: bool = False):
    label = f"{loop} --torch_compile" if compiled else loop
    run_dir = workdir / f"throughput-{loop}{'-compiled' if compiled else ''}"
    flags = ["--model_name_or_path", str(data / "model-float32"), "--train_file", str(data / "train.jsonl"),
             "--validation_file", str(data / "validation.jsonl"), "--num_train_epochs", "1",
             "--per_device_train_batch_size", str(sizes["batch"]), "--per_device_eval_batch_size", str(sizes["batch"]),
             "--mixed_precision", sizes["precision"], "--ddp_backend", sizes["backend"], "--eval_strategy", "no",
             "--save_strategy", "no", "--logging_steps", "50"]
    if device == "cpu":
        flags += ["--dataloader_num_workers", "0"]  # the config's 4 loader workers only slow a small CPU down
    # Compiled: the warm-up steps hold the first compiles (the longest batch first, then a graph for any length).
    flags += ["--torch_compile", "true", "--do_eval", "false"] if compiled else []  # no eval graphs to compile
    result, wall = train(project, run_dir, flags, sizes["warmup"])
    if result.returncode != 0:
        fail(f"{label} bf16 throughput run exited {result.returncode}: {last_error(result)}")
        return None
    probe_file = run_dir / "probe" / "rank0.json"
    probe = json.loads(probe_file.read_text()) if probe_file.is_file() else {}
    if not probe.get("samples"):
        fail(f"{label}: the probe counted nothing after {sizes['warmup']} warm-up steps ({probe_file})")
        return None
    metrics = json.loads((run_dir / "output" / "metrics.json").read_text())
    return {"loop": label, "wall_s": round(wall, 1), **rates(probe, sizes, peak),
            "loop_train_samples_per_s": metrics.get("train_samples_per_second"),
            "compiled_graphs": metrics.get("compiled_graphs")}


def rates(probe: dict, sizes: dict, peak: float | None) -> dict:
    """A probed run's figures after its warm-up: samples and real tokens a second, model FLOPs, MFU."""
    seconds = probe["gpu_window_seconds"] or (probe["last_step"] - probe["window_start"])
    config = sizes["model"]
    layers, hidden, inner = config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]
    weights = layers * (4 * hidden * hidden + 2 * hidden * inner)
    flops = 6 * weights * probe["real_tokens"] + 12 * layers * hidden * probe["squared_lengths"]
    return {
        "timed_steps": probe["steps"] - probe["warmup_steps"],
        "samples_per_s": round(probe["samples"] / seconds, 1),
        "real_tokens_per_s": round(probe["real_tokens"] / seconds),
        "padding_efficiency": round(probe["real_tokens"] / probe["processed_tokens"], 3),
        "model_tflops_per_s": float(f"{flops / seconds / 1e12:.3g}"),
        "mfu": None if peak is None else round(flops / seconds / (peak * 1e12), 3),
        "peak_rss_mib": probe["peak_rss_mib"],
    }


def compute_limit(data: Path, workdir: Path, sizes: dict, device: str, peak: float | None) -> dict | None:
    """bench/compute_limit.py, a bare eager loop on pre-built batches of the same examples, 1 process, probed
    as the loops are: the figures eager PyTorch reaches on this device, beside the loops'."""
    run_dir = workdir / "compute-limit"
    env = dict(os.environ, PYTHONPATH=str(BENCH / "probe"), BENCH_PROBE_DIR=str(run_dir / "probe"),
               BENCH_PROBE_WARMUP_STEPS=str(sizes["warmup"]), HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--rdzv-backend=c10d",
               "--rdzv-endpoint=127.0.0.1:0", str(BENCH / "compute_limit.py"), str(data / "model-float32"),
               str(data / "train.jsonl"), "--batch_size", str(sizes["batch"]), "--device", device]
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    probe_file = run_dir / "probe" / "rank0.json"
    if result.returncode != 0 or not probe_file.is_file():
        fail(f"the compute-limit run exited {result.returncode}: {last_error(result)}")
        return None
    return {"loop": "compute limit (bare eager loop)", "wall_s": round(time.perf_counter() - start, 1),
            **rates(json.loads(probe_file.read_text()), sizes, peak), "loop_train_samples_per_s": None}


def profiled(loop: str, project: Path, data: Path, workdir: Path, sizes: dict) -> dict | None:
    """A run of its own under torch.profiler (bench_probe.py): the throughput run's settings, for the
    warm-up steps and then PROFILE_STEPS profiled ones. Where each step's time goes: on the host, on the
    GPU, between them."""
    run_dir, steps = workdir / f"profile-{loop}", sizes["warmup"] + PROFILE_STEPS
    flags = ["--model_name_or_path", str(data / "model-float32"), "--train_file", str(data / "train.jsonl"),
             "--validation_file", str(data / "validation.jsonl"), "--max_steps", str(steps),
             "--max_train_samples", str(steps * sizes["batch"]), "--per_device_train_batch_size", str(sizes["batch"]),
             "--mixed_precision", sizes["precision"], "--ddp_backend", sizes["backend"], "--eval_strategy", "no",
             "--do_eval", "false", "--save_strategy", "no", "--logging_steps", "50"]
    result, _ = train(project, run_dir, flags, sizes["warmup"], BENCH_PROBE_PROFILE_STEPS=str(PROFILE_STEPS))
    probe_file = run_dir / "probe" / "rank0.json"
    profile = json.loads(probe_file.read_text()).get("profile") if probe_file.is_file() else None
    if result.returncode != 0 or not profile:
        fail(f"{loop} profiled run: exit {result.returncode}, "
             f"{'no profile in ' + str(probe_file) if result.returncode == 0 else last_error(result)}")
        return None
    return {"loop": loop, **profile}


def several_processes(loop: str, project: Path, data: Path, workdir: Path, sizes: dict, gpus: str,
                      flags: tuple[str, ...] = (), name: str = "several") -> tuple[dict, subprocess.CompletedProcess]:
    """The launch as users start it on a node of several GPUs: NPROC_PER_NODE=auto, one process per GPU, nccl,
    20 steps. With --cpu (gpus empty): 2 processes on gloo, which checks this function's logic only.

    One process on one GPU cannot show what only several processes on one node do (the preflight
    parsing on a node of many GPUs, each rank pinning its own, NCCL between them).
    """
    run_dir = workdir / f"{name}-{loop}"
    flags = ["--model_name_or_path", str(data / "model-float32"), "--train_file", str(data / "train.jsonl"),
             "--validation_file", str(data / "validation.jsonl"), "--max_steps", "20",
             "--per_device_train_batch_size", str(sizes["batch"]), "--per_device_eval_batch_size", str(sizes["batch"]),
             "--mixed_precision", "auto", "--eval_strategy", "no", "--save_strategy", "no", *flags]
    count = len(gpus.split(",")) if gpus else 2
    result, wall = train(project, run_dir, flags, warmup=0, NPROC_PER_NODE="auto" if gpus else str(count),
                         CUDA_VISIBLE_DEVICES=gpus)
    # Rank 0 logs the line, on cuda:0; a process alone joins no process group (backend None).
    where = f"device cuda:0, backend {'nccl' if count > 1 else None}" if gpus else "device cpu, backend gloo"
    passed = result.returncode == 0 and f"world size {count}, {where}" in result.stdout
    detail = f"{count} processes, exit {result.returncode}" + ("" if passed else f": {last_error(result)}")
    return {"loop": loop, "gpus": count if gpus else 0, "wall_s": round(wall, 1), "passed": passed,
            "detail": detail}, result


def sharded(loop: str, project: Path, data: Path, workdir: Path, sizes: dict, gpus: str) -> dict:
    """--fsdp true on every GPU here, 20 steps with a checkpoint at 10 and 20, then from a copy of checkpoint-10
    alone the same command again. It passes when the first run logs its sharding over every rank (on one GPU,
    the Trainer's over the one; the native loop says that it shards nothing) and leaves checkpoint-20 and the
    gathered final model, and the second resumes at step 10 and ends at step 20; the largest difference
    between the two final models' weights is reported (0 where the resume is exact, as on the CPU)."""
    flags = ("--fsdp", "true", "--save_strategy", "steps", "--save_steps", "10")
    first, result = several_processes(loop, project, data, workdir, sizes, gpus, flags, name="fsdp")
    count, output = first["gpus"] or 2, workdir / f"fsdp-{loop}" / "output"
    line, last_file = (NATIVE_ALONE if loop == "native" and count == 1 else
                       (f"sharded over {count} ranks", FSDP_CHECKPOINT_FILE[loop]))
    expected = {f"a log line '{line}'": line in result.stdout,
                "model.safetensors": (output / "model.safetensors").is_file(),
                f"checkpoint-20/{last_file}": (output / "checkpoint-20" / last_file).is_file()}
    missing = [what for what, found in expected.items() if not found]
    outcome = {**first, "loop": f"{loop} --fsdp", "passed": first["passed"] and not missing}
    if first["passed"] and missing:
        outcome["detail"] += f", but no {', '.join(missing)}"
    if not outcome["passed"]:
        return outcome
    resumed_dir = workdir / f"fsdp-resumed-{loop}"
    shutil.copytree(output / "checkpoint-10", resumed_dir / "output" / "checkpoint-10")
    again, result = several_processes(loop, project, data, workdir, sizes, gpus, flags, name="fsdp-resumed")
    metrics_file = resumed_dir / "output" / "metrics.json"
    steps = json.loads(metrics_file.read_text()).get("train_steps") if metrics_file.is_file() else None
    # Each loop's log line: "resumed from DIR at step 10" (native), "resuming from checkpoint DIR" (Trainer).
    resumed = re.search(r"resum\w* from (checkpoint )?\S*checkpoint-10\b", result.stdout + result.stderr)
    difference = weight_difference(output, resumed_dir / "output") if steps == 20 else None
    passed = again["passed"] and resumed is not None and steps == 20 and difference is not None
    logged = "logged" if resumed else "not logged"
    detail = (f"{first['detail']}; resumed from checkpoint-10 to step 20, weights within {difference:.3g} of the "
              "run not stopped" if passed else
              f"the resume from checkpoint-10 ({logged}) ended at step {steps}: {again['detail']}")
    return {**outcome, "wall_s": round(first["wall_s"] + again["wall_s"], 1), "passed": passed, "detail": detail,
            "resume_weight_difference": difference}


def weight_difference(first: Path, second: Path) -> float | None:
    """The largest absolute difference between two save_pretrained folders' weights; None if they differ in
    names or shapes."""
    from safetensors.torch import load_file

    one, two = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    if one.keys() != two.keys() or any(one[name].shape != two[name].shape for name in one):
        return None
    return max((one[name].float() - two[name].float()).abs().max().item() for name in one)


def half_precision(loop: str, project: Path, data: Path, workdir: Path, sizes: dict, dtype: str, precision: str):
    run_dir = workdir / f"half-{loop}-{dtype}-{precision}"
    flags = ["--model_name_or_path", str(data / f"model-{dtype}"), "--train_file", str(data / "half_train.jsonl"),
             "--validation_file", str(data / "validation.jsonl"), "--max_steps", str(sizes["half_steps"]),
             "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "16",
             "--mixed_precision", precision, "--ddp_backend", sizes["backend"], "--eval_strategy", "no",
             "--save_strategy", "no", "--dataloader_num_workers", "0"]
    result, wall = train(project, run_dir, flags, warmup=0)
    outcome = {"loop": loop, "checkpoint": dtype, "mixed_precision": precision, "wall_s": round(wall, 1)}
    if result.returncode != 0:
        return outcome | {"passed": False, "detail": f"exit {result.returncode}: {last_error(result)}"}
    metrics = json.loads((run_dir / "output" / "metrics.json").read_text())
    loss, saved = metrics.get("train_loss"), stored_dtypes(run_dir / "output")
    passed = isinstance(loss, float) and math.isfinite(loss) and loss > 0 and saved == {"F32"}
    return outcome | {"passed": passed, "detail": f"train loss {loss}, saved weights {'/'.join(sorted(saved))}"}


def report(device_name: str, peak: float | None, runs: list[dict], profiles: list[dict], halves: list[dict],
           cpu: bool) -> list[dict]:
    """Print the tables; return the targets."""
    peak_text = f"{peak:g} TFLOP/s dense bf16" if peak else "unknown peak (set PEAK_BF16_TFLOPS)"
    print(f"\n{device_name}, {peak_text}\n")
    print("| Loop | Samples/s | Real tokens/s | Padding eff. | Model TFLOP/s | MFU | Loop's own samples/s | Wall (s) "
          "| Graphs |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        mfu = "n/a" if run["mfu"] is None else f"{run['mfu']:.1%}"
        print(f"| {run['loop']} | {run['samples_per_s']} | {run['real_tokens_per_s']} | {run['padding_efficiency']} "
              f"| {run['model_tflops_per_s']} | {mfu} | {run['loop_train_samples_per_s'] or 'n/a'} | {run['wall_s']} "
              f"| {run.get('compiled_graphs') or '-'} |")
    if profiles:
        print(f"\nWhere a step's time goes (torch.profiler, {PROFILE_STEPS} steps after the warm-up; per step, "
              "the profiler's own cost included):\n")
        print("| Loop | Wall (ms) | Host CPU (ms) | GPU busy (ms) | GPU idle | Kernel launches | Host syncs "
              "| Reads back |\n|---|---:|---:|---:|---:|---:|---:|---:|")
        for profile in profiles:
            cells = [profile[key] for key in ("wall_ms", "cpu_ms", "gpu_busy_ms")]
            idle = "n/a" if profile["gpu_idle_share"] is None else f"{profile['gpu_idle_share']:.0%}"
            counts = ["n/a" if profile[key] is None else profile[key] for key in ("kernel_launches", "host_syncs")]
            print(f"| {profile['loop']} | {' | '.join('n/a' if cell is None else str(cell) for cell in cells)} "
                  f"| {idle} | {' | '.join(map(str, counts))} | {profile['reads_back']} |")
    print("\n| Loop | Checkpoint | --mixed_precision | Result | Detail |\n|---|---|---|---|---|")
    for half in halves:
        print(f"| {half['loop']} | {half['checkpoint']} | {half['mixed_precision']} | "
              f"{'pass' if half['passed'] else 'FAIL'} | {half['detail']} |")
    by_loop = {run["loop"]: run for run in runs}
    targets = []
    for loop, least in MFU_TARGETS.items():  # compiled, as the targets are set
        run = by_loop.get(f"{loop} --torch_compile")
        if run is not None and run["mfu"] is not None:
            targets.append({"target": f"{run['loop']} MFU >= {least:.0%}", "value": run["mfu"],
                            "met": run["mfu"] >= least})
    if {"native", "trainer"} <= by_loop.keys():
        ratio = by_loop["native"]["samples_per_s"] / by_loop["trainer"]["samples_per_s"]
        targets.append({"target": "native samples/s >= Trainer's", "value": round(ratio, 3), "met": ratio >= 1.0})
    print()
    for target in targets:
        print(f"- {target['target']}: {target['value']} ({'met' if target['met'] else 'missed'})")
    if cpu:
        print("- figures from --cpu (tiny sizes) check the script's logic; they measure nothing")
    return targets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU: checks the logic without a GPU")
    # Absolute paths: each run starts in its project's folder.
    parser.add_argument("--rendered", type=absolute, help="projects rendered earlier with --render-only")
    parser.add_argument("--render-only", type=absolute, metavar="DIR", help="render both loops into DIR and stop")
    parser.add_argument("--workdir", type=absolute, help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--json", type=absolute, default=BENCH / "results" / "gpu_check.json")
    args = parser.parse_args()
    if args.render_only is not None:
        for loop in LOOPS:
            print(render(args.render_only / loop, training_loop=loop, include_fsdp="yes"))
        return 0

    import torch

    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        fail(f"torch {torch.__version__} sees no CUDA GPU (a CPU build, or no driver): install a CUDA build of "
             "torch, or pass --cpu to check this script's logic on the CPU")
        return 1
    # One process drives one GPU (the loops refuse a single process that sees several); --cpu hides them all.
    # With several GPUs, several_processes then starts one process on each.
    every_gpu = ",".join(str(index) for index in range(torch.cuda.device_count())) if device == "cuda" else ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or "0"
    os.environ["CUDA_VISIBLE_DEVICES"] = "" if device == "cpu" else visible.split(",")[0]
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (--cpu)"
    peak = peak_tflops(device_name) if device == "cuda" else None
    if device == "cuda" and peak is None:
        fail(f"no known bf16 peak for {device_name!r}: set PEAK_BF16_TFLOPS; MFU is reported as n/a")
    sizes = SIZES[device]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    started = time.perf_counter()
    try:
        projects = projects_from(args, workdir)
        data = workdir / "data"
        write_assets(projects["native"], data, sizes)
        print(f"assets ready after {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        runs = []

        def measure(compiled: bool) -> None:
            for loop in LOOPS:
                run = throughput(loop, projects[loop], data, workdir, sizes, device, peak, compiled)
                if run is not None:
                    runs.append(run)
                    print(f"{run['loop']}: {run['samples_per_s']} samples/s, {run['model_tflops_per_s']} model "
                          f"TFLOP/s, wall {run['wall_s']} s", file=sys.stderr, flush=True)

        measure(compiled=False)
        limit = compute_limit(data, workdir, sizes, device, peak)
        profiles = [profile for loop in LOOPS
                    if (profile := profiled(loop, projects[loop], data, workdir, sizes)) is not None]
        halves = []
        for loop in LOOPS:
            for dtype, precision in (("float16", "fp16" if device == "cuda" else "no"), ("bfloat16", "bf16")):
                half = half_precision(loop, projects[loop], data, workdir, sizes, dtype, precision)
                halves.append(half)
                if not half["passed"]:
                    fail(f"{loop} from the {dtype} checkpoint with --mixed_precision {precision}: {half['detail']}")
                print(f"{loop} {dtype} {precision}: {'pass' if half['passed'] else 'FAIL'}", file=sys.stderr,
                      flush=True)
        severals = []

        def check(several: dict) -> None:
            severals.append(several)
            where = f"{several['gpus']} GPU(s)" if several["gpus"] else "2 CPU processes"
            if not several["passed"]:
                fail(f"{several['loop']} on {where}: {several['detail']}")
            print(f"{several['loop']} on {where}: {'pass' if several['passed'] else 'FAIL'}", file=sys.stderr,
                  flush=True)

        if "," in every_gpu or device == "cpu":  # 2 or more GPUs; --cpu: 2 processes, for the logic
            for loop in LOOPS:
                check(several_processes(loop, projects[loop], data, workdir, sizes, every_gpu)[0])
        else:
            print("one GPU here: the run with one process per GPU needs 2 or more", file=sys.stderr, flush=True)

        def seconds_left() -> float:  # gpu_check.sh says what is left of its budget
            return float(os.environ.get("GPU_CHECK_SECONDS_LEFT", "inf")) - (time.perf_counter() - started)

        # Then the compiled runs (the MFU targets), then FSDP through a resume, each if the budget allows.
        for seconds, what, run in (
                (COMPILED_RUNS_SECONDS[device], "the --torch_compile runs", lambda: measure(compiled=True)),
                # The Trainer's --fsdp is refused on CPU (accelerate would train plain DDP): GPUs only.
                (SHARDED_RUNS_SECONDS[device], "the --fsdp runs", lambda: [
                    check(sharded(loop, projects[loop], data, workdir, sizes, every_gpu))
                    for loop in LOOPS if device == "cuda" or loop == "native"])):
            if seconds_left() > seconds:
                run()
            else:
                fail(f"only {seconds_left():.0f} s of the budget left: {what} need about {seconds} s (raise "
                     "GPU_CHECK_BUDGET_SECONDS)")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    targets = report(device_name, peak, runs + ([limit] if limit else []), profiles, halves, cpu=device == "cpu")
    for several in severals:
        where = f"{several['gpus']} GPUs, one process each" if several["gpus"] else "2 CPU processes (--cpu)"
        print(f"- {several['loop']} on {where}: "
              f"{'pass' if several['passed'] else 'FAIL'} ({several['detail']}, {several['wall_s']} s)")
    elapsed = time.perf_counter() - started
    print(f"\ngpu check took {elapsed:.0f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"device": device_name, "peak_bf16_tflops": peak, "torch": torch.__version__,
                                     "sizes": sizes, "throughput": runs, "compute_limit": limit,
                                     "profile": profiles, "half_precision": halves, "several_processes": severals,
                                     "targets": targets, "elapsed_s": elapsed}, indent=1) + "\n")
    failed = (len(runs) < len(LOOPS) or limit is None or len(profiles) < len(LOOPS)
              or not all(run["passed"] for run in [*halves, *severals]) or (device == "cuda" and peak is None))
    if failed:
        fail("some runs failed; see the error lines above")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
