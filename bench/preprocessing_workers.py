"""Benchmark: tokenising 100,000 reviews in one process against --preprocessing_num_workers 2.

Renders the template, writes an imdb-like train file (workload.py: median about 170 words, cut at
512 tokens) and tokenises it with the project's own data.tokenize_datasets and the smoke tokenizer,
in this process and in 2 worker processes, alternating the order each round. Every run reads the
file into a fresh datasets cache first (not timed), so none finds another's tokenised shards. Checks
that both give the same table and fingerprint, then prints a Markdown table with the ratio, and
the load average: on a shared machine read the ratio, not the absolute numbers.

    python bench/preprocessing_workers.py [--rows 100000] [--workers 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from workload import MAX_TOKENS, PACKAGE, imdb_like_rows, render, smoke_module, write_jsonl


def cpu_seconds() -> float:
    """CPU time of this process and of its ended children (the map's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tokenise_once(data, train_file: Path, cache_dir: Path, tokenizer, workers: int):
    """(wall s, CPU s, tokenised train split) of one tokenize_datasets call on a fresh cache."""
    from datasets import DatasetDict

    raw = data.read_files({"train": str(train_file)}, str(cache_dir))
    task = data.Task("single_label_classification", ["0", "1"], max_seq_length=MAX_TOKENS)
    start_wall, start_cpu = time.perf_counter(), cpu_seconds()
    tokenized = data.tokenize_datasets(DatasetDict(train=raw["train"]), tokenizer, task, num_proc=workers)
    return time.perf_counter() - start_wall, cpu_seconds() - start_cpu, tokenized["train"]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        project = render(workdir / "render")
        smoke = smoke_module(project)
        data = importlib.import_module(f"{PACKAGE}.data")
        import datasets
        import transformers

        datasets.disable_progress_bars()
        train_file = workdir / "train.jsonl"
        write_jsonl(train_file, imdb_like_rows(smoke, args.rows, seed=0, max_words=1000))
        tokenizer = smoke.build_tokenizer()  # what `python -m <package>.smoke` saves with tiny-bert
        tokenizer.model_max_length = MAX_TOKENS

        counts = (1, args.workers)
        walls: dict[int, list[float]] = {count: [] for count in counts}
        cpus: dict[int, list[float]] = {count: [] for count in counts}
        results = {}
        for round_index in range(args.rounds):
            for count in counts if round_index % 2 == 0 else counts[::-1]:
                cache_dir = workdir / f"cache-{round_index}-{count}"
                wall, cpu, train = tokenise_once(data, train_file, cache_dir, tokenizer, count)
                walls[count].append(wall)
                cpus[count].append(cpu)
                results.setdefault(count, train)
                print(f"round {round_index + 1} {count} worker(s) {wall:7.1f} s wall {cpu:7.1f} s CPU  "
                      f"load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        one, many = results[1], results[args.workers]
        identical = one._fingerprint == many._fingerprint and one.data.table.equals(many.data.table)
        tokens = sum(one["length"])
    load_after = os.getloadavg()

    median = {count: statistics.median(values) for count, values in walls.items()}
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores ({cpu_name()}); datasets {datasets.__version__}, "
          f"transformers {transformers.__version__}; {args.rows} rows, {tokens} tokens, max_seq_length {MAX_TOKENS}; "
          f"median of {args.rounds} round(s); "
          f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', 'unset')}")
    print()
    print("| `--preprocessing_num_workers` | Wall per round (s) | Median wall (s) | Rows/s | CPU s (median) |")
    print("|---|---:|---:|---:|---:|")
    for count in counts:
        label = f"{count} (in this process)" if count == 1 else f"{count} (worker processes)"
        print(f"| {label} | {' / '.join(f'{wall:.1f}' for wall in walls[count])} | {median[count]:.1f} | "
              f"{args.rows / median[count]:.0f} | {statistics.median(cpus[count]):.1f} |")
    print()
    print(f"- speed-up, 1 worker's median wall / {args.workers} workers': {median[1] / median[args.workers]:.2f}x")
    print(f"- same rows, order and fingerprint: {'yes' if identical else 'NO'}")
    print(f"- load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after "
          f"(5 min: {load_before[1]:.1f}, {load_after[1]:.1f})")
    if not identical:
        raise SystemExit("error: the tokenised tables differ between 1 and several workers")


if __name__ == "__main__":
    main()
