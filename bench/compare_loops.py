"""Native loop vs Trainer: the smoke training of both variants, side by side, in one invocation.

    python bench/compare_loops.py [--repeats 3] [--nproc 2] [-- extra training flags]

Renders the template once per training loop, builds the smoke assets once, then alternates
torchrun runs of the two variants (the first variant of each round alternates too, so neither
always runs on a warmer machine).
Prints each run's train samples/s (from its metrics.json) and wall time, the medians, and the
native/trainer ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workload import PACKAGE, render

LOOPS = ("trainer", "native")


def environment(repo: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(repo / "src"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def train_once(repo: Path, assets: Path, output_dir: Path, nproc: int, extra: list[str]) -> dict[str, float]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", f"{PACKAGE}.train", str(repo / "configs" / "smoke.yaml"),
        "--model_name_or_path", str(assets / "tiny-bert"),
        "--train_file", str(assets / "train.jsonl"),
        "--validation_file", str(assets / "validation.jsonl"),
        "--output_dir", str(output_dir),
        "--disable_tqdm", "true",
        *extra,
    ]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=repo, env=environment(repo), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{repo.name}: torchrun exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    metrics = json.loads((output_dir / "metrics.json").read_text())
    return {"samples_per_second": metrics["train_samples_per_second"], "train_runtime": metrics["train_runtime"],
            "eval_accuracy": metrics["eval_accuracy"], "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant")
    parser.add_argument("--nproc", type=int, default=2, help="processes per run")
    parser.add_argument("extra", nargs="*", help="training flags for both variants, after --")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    if load > 0.5:
        print(f"note: load average {load:.1f} before starting; other work on the machine adds noise", flush=True)

    with tempfile.TemporaryDirectory(prefix="compare_loops_") as scratch:
        scratch = Path(scratch)
        repos = {loop: render(scratch / loop, training_loop=loop) for loop in LOOPS}
        assets = scratch / "smoke_assets"
        subprocess.run([sys.executable, "-m", f"{PACKAGE}.smoke", "--output_dir", str(assets)], check=True,
                       env=environment(repos["native"]), capture_output=True)
        results: dict[str, list[dict]] = {loop: [] for loop in LOOPS}
        for round_index in range(args.repeats):
            order = LOOPS if round_index % 2 == 0 else LOOPS[::-1]
            for loop in order:
                run = train_once(repos[loop], assets, scratch / f"out-{loop}-{round_index}", args.nproc, args.extra)
                results[loop].append(run)
                print(f"round {round_index + 1} {loop:8s} {run['samples_per_second']:8.1f} samples/s  "
                      f"train {run['train_runtime']:6.2f} s  wall {run['wall']:6.2f} s  "
                      f"eval accuracy {run['eval_accuracy']:.3f}", flush=True)

    medians = {loop: statistics.median(run["samples_per_second"] for run in results[loop]) for loop in LOOPS}
    walls = {loop: statistics.median(run["wall"] for run in results[loop]) for loop in LOOPS}
    # Each round's two runs are back to back, so their ratio cancels slow changes in background load.
    paired = [native["samples_per_second"] / trainer["samples_per_second"]
              for native, trainer in zip(results["native"], results["trainer"], strict=True)]
    print()
    for loop in LOOPS:
        print(f"{loop:8s} median {medians[loop]:8.1f} train samples/s, median wall {walls[loop]:6.2f} s")
    print(f"native/trainer throughput ratio: {medians['native'] / medians['trainer']:.2f} (of the medians), "
          f"{statistics.median(paired):.2f} (median of the per-round ratios)")


if __name__ == "__main__":
    main()
