"""The loops against the seed guide's loop and the compute limit: one workload, side by side (`make bench`).

    python bench/benchmark.py [--repeats 3] [--json bench/results/latest.json]

Renders the template once per training loop, writes one imdb-like workload (bench/workload.py:
1024 train and 128 eval reviews, a bert-tiny-sized BERT saved with save_pretrained) and runs
eight rows on it, each as a whole command under torchrun with 2 processes (gloo, fp32 on CPU),
one epoch at 8 examples per process per step:

- native, Trainer: the rendered projects' `scripts/train_single_node.sh`, as users run them
  (the preflight, training, then the final save and evaluation they always do);
- native with PREFLIGHT=0: the same command without its preflight, for what the preflight costs;
- native and Trainer with --torch_compile true: the same commands compiled (inductor), each with a fresh
  compile cache, so that the compiling counts as on a first run;
- HF: transformers' own examples/pytorch/text-classification/run_classification.py for the installed
  version, fetched at bench time into a temporary folder (or given with --hf_example), with its best
  settings (--pad_to_max_length False --train_sampling_strategy group_by_length), really synced on
  CPU (--use_cpu --ddp_backend gloo: without them each rank trains alone), the same data, model,
  batch, learning rate, epoch and 512-token truncation; its --metric_name is bench/accuracy, a local
  `evaluate` metric (it needs the `evaluate` package, in requirements-dev.txt);
- seed: bench/seed_loop.py, the seed guide's loop (padding every example to 512 tokens);
- limit: bench/compute_limit.py, the same model stepping on pre-built, least-padded batches of the
  same tokens, with no loader and no logging.

The rows run in rotating order (each round starts one row later), `--repeats` rounds; the table
gives the median of each column over the rounds (each column on its own), and ratios of those
medians. Every row gets OMP_NUM_THREADS = cores / processes, what the launch scripts pick.

How each column is measured, the same way for every row:
- wall: the whole command, from just before it starts to its exit (time.perf_counter()), startup,
  tokenising, saving and evaluation included;
- first step: from just before the command starts to the end of its first optimizer step on the
  slowest rank (time.time() on both sides);
- samples/s and real tokens/s: the examples and the non-padding tokens (attention-mask sums) that
  went through the model in train mode, over all ranks, divided by the train phase: from the first
  train forward on any rank to the last optimizer step on any rank;
- padding efficiency: real tokens / tokens processed (padding included) in train mode;
- peak RSS per rank: each rank's own peak resident memory (ru_maxrss) at its exit.
After the table: what importing the train module costs in each render, per top-level package
(`python -X importtime`), which the launch pays once per node before the first step.
The JSON also has samples per CPU second of the busiest rank in the train phase (time.process_time()),
which other work on the machine disturbs less than wall time.
The times and counts come from bench/probe/: put on PYTHONPATH, its sitecustomize.py adds
torch's global optimizer-step and module-forward hooks to every torchrun worker, without a change
to the code that is measured (see bench_probe.py), so every column is measured for every row.
Each run gets a fresh Hugging Face cache, so every row loads and tokenises its data as on a first run.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from importlib import metadata
from pathlib import Path

from workload import MAX_TOKENS, PACKAGE, render, write_workload

BENCH = Path(__file__).resolve().parent
ROWS = ("native", "native_no_preflight", "native_compiled", "trainer", "trainer_compiled", "hf", "seed", "limit")
TITLES = {
    "native": "native loop (`scripts/train_single_node.sh`)",
    "native_no_preflight": "native loop, `PREFLIGHT=0` (the same without its preflight)",
    "native_compiled": "native loop, `--torch_compile true`",
    "trainer": "Trainer loop (`scripts/train_single_node.sh`)",
    "trainer_compiled": "Trainer loop, `--torch_compile true`",
    "hf": "HF's `run_classification.py`, tuned",
    "seed": "seed guide's loop (`bench/seed_loop.py`)",
    "limit": "compute limit (`bench/compute_limit.py`)",
}
# bert-tiny's size (google/bert_uncased_L-2_H-128_A-2): small enough for every row to run a few
# times within the 10 minutes the benchmark may take on 2 cores.
MODEL_CONFIG = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512}
BATCH_SIZE = 8  # per process per step, as in the seed guide
LEARNING_RATE = 5e-5  # the seed guide's
TARGETS = [  # (label, row, measure, threshold)
    ("native samples/s >= 2.5x the seed's", "native", "samples_vs_seed", 2.5),
    ("Trainer samples/s >= 2.5x the seed's", "trainer", "samples_vs_seed", 2.5),
    ("native wall time: the seed's / native's >= 2.0", "native", "seed_wall_vs_wall", 2.0),
    ("Trainer wall time: the seed's / Trainer's >= 2.0", "trainer", "seed_wall_vs_wall", 2.0),
    ("native padding efficiency >= 0.95", "native", "padding_efficiency", 0.95),
    ("Trainer padding efficiency >= 0.95", "trainer", "padding_efficiency", 0.95),
    ("native samples/s >= 0.8x the limit's", "native", "samples_vs_limit", 0.8),
    # A whole command within 1.05x the limit's wall time: the limit's / the row's >= 1 / 1.05.
    ("native wall time within 1.05x the limit's: the limit's / native's >= 0.95", "native", "limit_wall_vs_wall",
     1 / 1.05),
    ("Trainer wall time within 1.05x the limit's: the limit's / Trainer's >= 0.95", "trainer", "limit_wall_vs_wall",
     1 / 1.05),
    # At most 0.85x HF's tuned example's wall time: HF's / the row's >= 1 / 0.85.
    ("native wall time at most 0.85x HF's example: HF's / native's >= 1.18", "native", "hf_wall_vs_wall", 1 / 0.85),
    ("Trainer wall time at most 0.85x HF's example: HF's / Trainer's >= 1.18", "trainer", "hf_wall_vs_wall",
     1 / 0.85),
    ("native first step within 1.2x the limit's: the limit's / native's >= 0.83", "native",
     "limit_first_step_vs_first_step", 1 / 1.2),
    ("Trainer first step within 1.2x the limit's: the limit's / Trainer's >= 0.83", "trainer",
     "limit_first_step_vs_first_step", 1 / 1.2),
    ("native --torch_compile samples/s >= native's", "native_compiled", "samples_vs_eager", 1.0),
    ("Trainer --torch_compile samples/s >= Trainer's", "trainer_compiled", "samples_vs_eager", 1.0),
]
LOOP_OF_ROW = {"native": "native", "native_no_preflight": "native", "native_compiled": "native", "trainer": "trainer",
               "trainer_compiled": "trainer"}
EAGER_OF_ROW = {"native_compiled": "native", "trainer_compiled": "trainer"}


def row_command(row: str, projects: dict[str, Path], data: Path, output_dir: Path, nproc: int,
                hf_example: Path) -> list[str]:
    if row in LOOP_OF_ROW:
        return [
            str(projects[LOOP_OF_ROW[row]] / "scripts" / "train_single_node.sh"),
            "--model_name_or_path", str(data / "model"),
            "--train_file", str(data / "train.jsonl"),
            "--validation_file", str(data / "validation.jsonl"),
            "--output_dir", str(output_dir),
            "--num_train_epochs", "1",
            "--per_device_train_batch_size", str(BATCH_SIZE),
            "--learning_rate", str(LEARNING_RATE),
            "--disable_tqdm", "true",
            *(["--torch_compile", "true"] if row in EAGER_OF_ROW else []),
        ]
    if row == "hf":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                str(hf_example), "--model_name_or_path", str(data / "model"),
                "--train_file", str(data / "train.json"), "--validation_file", str(data / "validation.json"),
                "--text_column_names", "text", "--label_column_name", "label", "--metric_name", str(BENCH / "accuracy"),
                "--do_train", "--do_eval", "--max_seq_length", str(MAX_TOKENS), "--output_dir", str(output_dir),
                "--num_train_epochs", "1", "--per_device_train_batch_size", str(BATCH_SIZE),
                "--learning_rate", str(LEARNING_RATE), "--pad_to_max_length", "False",
                "--train_sampling_strategy", "group_by_length", "--use_cpu", "--ddp_backend", "gloo",
                "--report_to", "none", "--disable_tqdm", "true"]
    script = {"seed": "seed_loop.py", "limit": "compute_limit.py"}[row]
    extra = ["--batch_size", str(BATCH_SIZE), "--learning_rate", str(LEARNING_RATE)] if row == "limit" else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            str(BENCH / script), str(data / "model"), str(data / "train.jsonl"), *extra]


def row_environment(row: str, run_dir: Path, nproc: int) -> dict[str, str]:
    return dict(
        os.environ,
        PYTHON=sys.executable,  # the interpreter the launch scripts start torchrun with
        NPROC_PER_NODE=str(nproc),
        # What the launch scripts choose by themselves, set for every row alike.
        OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // nproc)),
        PYTHONPATH=str(BENCH / "probe"),
        BENCH_PROBE_DIR=str(run_dir / "probe"),
        BENCH_PROBE_WARMUP_STEPS="0",
        HF_HOME=str(run_dir / "hf"),  # a fresh cache: every row tokenises as on a first run ...
        TORCHINDUCTOR_CACHE_DIR=str(run_dir / "inductor"),  # ... and a compiled row compiles as on one
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        CUDA_VISIBLE_DEVICES="",  # a CPU benchmark, as the seed and limit rows are; GPUs: bench/gpu_check.sh
        PREFLIGHT="0" if row == "native_no_preflight" else "1",
    )


def run_once(row: str, command: list[str], cwd: Path, run_dir: Path, nproc: int) -> dict:
    """Run one command; return its measured columns."""
    start_clock, start = time.time(), time.perf_counter()
    try:
        result = subprocess.run(command, cwd=cwd, env=row_environment(row, run_dir, nproc), capture_output=True,
                                text=True, timeout=900)
    except subprocess.TimeoutExpired:
        sys.exit(f"error: {row}: still running after 900 s; stopped (is another job holding the cores?)")
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"error: {row}: exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    ranks = [json.loads(path.read_text()) for path in sorted((run_dir / "probe").glob("rank*.json"))]
    if len(ranks) != nproc or not all(rank["steps"] and rank["samples"] for rank in ranks):
        sys.exit(f"error: {row}: the probe reported {len(ranks)} of {nproc} ranks, or no steps; is bench/probe "
                 f"on PYTHONPATH?\n{result.stderr[-3000:]}")
    train_seconds = max(rank["last_step"] for rank in ranks) - min(rank["window_start"] for rank in ranks)
    real = sum(rank["real_tokens"] for rank in ranks)
    metrics_file = run_dir / "output" / "metrics.json"  # the loops' own, with --torch_compile's graph count
    graphs = json.loads(metrics_file.read_text()).get("compiled_graphs") if metrics_file.is_file() else None
    return {
        "wall_s": wall,
        "first_forward_s": min(rank["first_forward"] for rank in ranks) - start_clock,
        "first_step_s": max(rank["first_step"] for rank in ranks) - start_clock,
        "train_s": train_seconds,
        "samples": sum(rank["samples"] for rank in ranks),
        "steps": ranks[0]["steps"],
        "samples_per_s": sum(rank["samples"] for rank in ranks) / train_seconds,
        # JSON only: the same per CPU second of the busiest rank, less sensitive to other work on the machine.
        "samples_per_cpu_s": sum(rank["samples"] for rank in ranks) / max(rank["window_cpu_seconds"] for rank in ranks),
        "real_tokens_per_s": real / train_seconds,
        "padding_efficiency": real / sum(rank["processed_tokens"] for rank in ranks),
        "peak_rss_mib": [rank["peak_rss_mib"] for rank in ranks],
    } | ({"compiled_graphs": graphs} if graphs is not None else {})


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Median of every column per row, then the ratios of those medians to the seed and the limit."""
    medians = {}
    for row, row_runs in runs.items():
        medians[row] = {key: statistics.median(run[key] for run in row_runs)
                        for key, value in row_runs[0].items() if not isinstance(value, list)}
        per_rank = zip(*(run["peak_rss_mib"] for run in row_runs), strict=True)
        medians[row]["peak_rss_mib"] = [statistics.median(ranks) for ranks in per_rank]
    for row in medians:
        medians[row]["samples_vs_seed"] = medians[row]["samples_per_s"] / medians["seed"]["samples_per_s"]
        medians[row]["seed_wall_vs_wall"] = medians["seed"]["wall_s"] / medians[row]["wall_s"]
        medians[row]["samples_vs_limit"] = medians[row]["samples_per_s"] / medians["limit"]["samples_per_s"]
        medians[row]["limit_wall_vs_wall"] = medians["limit"]["wall_s"] / medians[row]["wall_s"]
        medians[row]["hf_wall_vs_wall"] = medians["hf"]["wall_s"] / medians[row]["wall_s"]
        medians[row]["limit_first_step_vs_first_step"] = medians["limit"]["first_step_s"] / medians[row]["first_step_s"]
        if row in EAGER_OF_ROW:
            eager = medians[EAGER_OF_ROW[row]]
            medians[row]["samples_vs_eager"] = medians[row]["samples_per_s"] / eager["samples_per_s"]
    return medians


def markdown(medians: dict[str, dict]) -> str:
    lines = [
        "| Row | Wall (s) | First step (s) | Samples/s | Real tokens/s | Padding eff. | Peak RSS per rank (MiB) "
        "| Samples/s vs seed | Seed wall / wall | Samples/s vs limit | Limit wall / wall | HF wall / wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in ROWS:
        m = medians[row]
        rss = " / ".join(f"{value:.0f}" for value in m["peak_rss_mib"])
        lines.append(f"| {TITLES[row]} | {m['wall_s']:.1f} | {m['first_step_s']:.1f} | {m['samples_per_s']:.1f} "
                     f"| {m['real_tokens_per_s']:.0f} | {m['padding_efficiency']:.3f} | {rss} "
                     f"| {m['samples_vs_seed']:.2f}x | {m['seed_wall_vs_wall']:.2f}x | {m['samples_vs_limit']:.2f}x "
                     f"| {m['limit_wall_vs_wall']:.2f}x | {m['hf_wall_vs_wall']:.2f}x |")
    return "\n".join(lines)


def import_times(project: Path) -> dict[str, float]:
    """Seconds `import <package>.train` takes in a new process, per top-level package: each module's own
    time under `python -X importtime`, summed by the package it belongs to. The launch pays this once per
    node, in the process the workers are forked from, before the first step."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {PACKAGE}.train"], cwd=project,
                            env=dict(os.environ, PYTHONPATH=str(project / "src")), capture_output=True, text=True,
                            check=True)
    seconds: collections.Counter = collections.Counter()
    for line in result.stderr.splitlines():  # "import time: <own us> | <cumulative us> | <indent><module>"
        own, *_, module = line.removeprefix("import time:").split("|")
        if line.startswith("import time:") and own.strip().isdigit():  # not the header line
            seconds[module.strip().split(".")[0]] += int(own) / 1e6
    return dict(seconds)


def import_table(times: dict[str, dict[str, float]], shown: int = 8) -> str:
    """The packages that take longest to import in either loop, then the rest and the total."""
    loops = list(times)
    heaviest = sorted({name for loop in loops for name in times[loop]},
                      key=lambda name: -max(times[loop].get(name, 0.0) for loop in loops))[:shown]
    lines = [f"| `import {PACKAGE}.train` (`-X importtime`) | " + " | ".join(f"{loop} (s)" for loop in loops) + " |",
             "|---|" + "---:|" * len(loops)]
    for name in heaviest:
        lines.append(f"| {name} | " + " | ".join(f"{times[loop].get(name, 0.0):.2f}" for loop in loops) + " |")
    rest = [sum(value for name, value in times[loop].items() if name not in heaviest) for loop in loops]
    lines.append("| everything else | " + " | ".join(f"{value:.2f}" for value in rest) + " |")
    lines.append("| **total** | " + " | ".join(f"**{sum(times[loop].values()):.2f}**" for loop in loops) + " |")
    return "\n".join(lines)


def check_targets(medians: dict[str, dict]) -> list[dict]:
    return [{"target": label, "value": medians[row][measure], "threshold": threshold,
             "met": medians[row][measure] >= threshold} for label, row, measure, threshold in TARGETS]


def fetch_hf_example(folder: Path) -> Path:
    """transformers' run_classification.py at the installed version's tag, into folder (Apache-2.0: fetched
    for the run, never kept in this repo)."""
    import transformers

    url = (f"https://raw.githubusercontent.com/huggingface/transformers/v{transformers.__version__}/examples/"
           "pytorch/text-classification/run_classification.py")
    path = folder / "run_classification.py"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            path.write_bytes(response.read())
    except OSError as err:
        sys.exit(f"error: could not fetch {url} ({err}): download it and pass --hf_example PATH")
    return path


# The libraries whose versions a bench run reports (its header and JSON), as a run's metrics.json does.
LIBRARIES = ("torch", "transformers", "accelerate", "datasets", "tokenizers", "peft")


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu_model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                     platform.processor())
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return {"cpu_cores": os.cpu_count(), "cpu_model": cpu_model, "gpu": "none used (CUDA_VISIBLE_DEVICES empty)",
            "python": platform.python_version(), **versions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each runs every row once")
    parser.add_argument("--nproc", type=int, default=2, help="processes per run")
    parser.add_argument("--train_size", type=int, default=1024)
    parser.add_argument("--eval_size", type=int, default=128)
    parser.add_argument("--json", type=Path, default=BENCH / "results" / "latest.json", help="where the JSON goes")
    parser.add_argument("--hf_example", type=Path, help="transformers' run_classification.py [default: fetched from "
                        "GitHub for the installed transformers version]")
    args = parser.parse_args()
    started = time.perf_counter()
    load_before = os.getloadavg()
    if load_before[0] > 0.5:
        print(f"note: load average {load_before[0]:.1f} before starting; other work on the machine adds noise",
              file=sys.stderr, flush=True)

    runs: dict[str, list[dict]] = {row: [] for row in ROWS}
    with tempfile.TemporaryDirectory(prefix="bench_") as scratch:
        scratch = Path(scratch)
        hf_example = args.hf_example or fetch_hf_example(scratch)
        projects = {loop: render(scratch / loop, training_loop=loop) for loop in ("native", "trainer")}
        data = scratch / "data"
        write_workload(projects["native"], data, args.train_size, args.eval_size, MODEL_CONFIG)
        for split in ("train", "validation"):  # run_classification.py takes .csv and .json (JSON lines) files
            (data / f"{split}.json").symlink_to(f"{split}.jsonl")
        for round_index in range(args.repeats):
            shift = round_index % len(ROWS)
            for row in ROWS[shift:] + ROWS[:shift]:
                run_dir = scratch / f"{row}-{round_index}"
                command = row_command(row, projects, data, run_dir / "output", args.nproc, hf_example)
                run = run_once(row, command, projects[LOOP_OF_ROW[row]] if row in LOOP_OF_ROW else BENCH, run_dir,
                               args.nproc)
                runs[row].append(run)
                print(f"round {round_index + 1} {row:19s} wall {run['wall_s']:6.1f} s  first step "
                      f"{run['first_step_s']:5.1f} s  {run['samples_per_s']:7.1f} samples/s  "
                      f"({run['samples_per_cpu_s']:.1f} per CPU s)  padding eff. {run['padding_efficiency']:.3f}",
                      file=sys.stderr, flush=True)

        imports = {loop: import_times(project) for loop, project in projects.items()}

    medians = summarise(runs)
    targets = check_targets(medians)
    today = datetime.date.today().isoformat()
    host = machine()
    versions = ", ".join(f"{name} {host[name]}" for name in LIBRARIES)
    print(f"{today}, {host['cpu_cores']} CPU cores ({host['cpu_model']}), no GPU used; Python {host['python']}, "
          f"{versions}; median of {args.repeats} rounds, {args.nproc} processes, "
          f"{args.train_size} train examples, 1 epoch, {BATCH_SIZE} per process per step\n")
    print(markdown(medians))
    print()
    for target in targets:
        print(f"- {target['target']}: {target['value']:.2f} ({'met' if target['met'] else 'missed'})")
    for row in EAGER_OF_ROW:
        print(f"- {TITLES[row]}: {medians[row]['compiled_graphs']:.0f} graphs compiled on rank 0, first step at "
              f"{medians[row]['first_step_s']:.1f} s against {medians[EAGER_OF_ROW[row]]['first_step_s']:.1f} s eager")
    print("\nWhat the launch still pays before the first step, once per node (the workers fork from the process "
          "that imported it); `-X importtime` itself adds to each figure:\n")
    print(import_table(imports))
    elapsed = time.perf_counter() - started
    print(f"\nbenchmark took {elapsed:.0f} s; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "date": today, "machine": host, "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "elapsed_s": elapsed,
        "workload": {"train_size": args.train_size, "eval_size": args.eval_size, "epochs": 1, "nproc": args.nproc,
                     "per_device_batch_size": BATCH_SIZE, "max_tokens": MAX_TOKENS, "model": MODEL_CONFIG,
                     "package": PACKAGE},
        "repeats": args.repeats, "medians": medians, "targets": targets, "runs": runs, "import_seconds": imports,
    }, indent=1) + "\n")
    print(f"JSON written to {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
