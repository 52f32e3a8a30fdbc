"""Benchmark: train throughput with length-grouped batches against random batches.

Renders the template, writes an imdb-like data set (word counts drawn from a log-normal fitted to
imdb's review lengths: median about 170 words, long tail cut at 512 tokens) and trains the same
small BERT twice per strategy, alternating, in one process. Prints samples/s for each strategy,
the median ratio and the share of padding tokens each produced. The machine is noisy: read the
ratio, not the absolute numbers.

    python bench/length_grouping.py [--rounds 2] [--train_size 1024]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from workload import MAX_TOKENS, PACKAGE, imdb_like_rows, render, save_model, smoke_module, write_jsonl

# The smoke model's size, with room for 512 positions.
MODEL_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def write_imdb_like(project: Path, data_dir: Path, size: int, seed: int) -> None:
    smoke = smoke_module(project)
    rows = imdb_like_rows(smoke, size, seed, max_words=500)
    write_jsonl(data_dir / "train.jsonl", rows)
    write_jsonl(data_dir / "validation.jsonl", rows[:64])
    save_model(smoke, data_dir / "model", MODEL_CONFIG, seed)


def train_once(project: Path, data_dir: Path, strategy: str, output_dir: Path, batch_size: int) -> float:
    command = [
        sys.executable, "-m", "text_classifier.train",
        "--model_name_or_path", str(data_dir / "model"),
        "--train_file", str(data_dir / "train.jsonl"),
        "--validation_file", str(data_dir / "validation.jsonl"),
        "--output_dir", str(output_dir),
        "--max_seq_length", str(MAX_TOKENS),
        "--per_device_train_batch_size", str(batch_size),
        "--num_train_epochs", "1",
        "--save_strategy", "no",
        "--disable_tqdm", "true",
        "--train_sampling_strategy", strategy,
        "--seed", "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(project / "src")}
    subprocess.run(command, cwd=project, env=env, check=True, capture_output=True)
    return json.loads((output_dir / "metrics.json").read_text())["train_samples_per_second"]


def padding_share(lengths: list[int], batches: list[list[int]]) -> float:
    real = sum(lengths[i] for batch in batches for i in batch)
    padded = sum(max(lengths[i] for i in batch) * len(batch) for batch in batches)
    return 1 - real / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train_size", type=int, default=1024)
    parser.add_argument("--batch_size", type=int, default=16)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        project = render(workdir / "render")
        data_dir = workdir / "data"
        write_imdb_like(project, data_dir, args.train_size, seed=0)

        import torch
        from transformers import AutoTokenizer

        data = importlib.import_module(f"{PACKAGE}.data")  # the render's src/ is on sys.path (smoke_module)
        tokenizer = AutoTokenizer.from_pretrained(data_dir / "model")
        texts = [json.loads(line)["text"] for line in (data_dir / "train.jsonl").read_text().splitlines()]
        lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=MAX_TOKENS)["input_ids"]]
        generator = torch.Generator().manual_seed(0)
        order_random = torch.randperm(len(lengths), generator=generator).tolist()
        # Grouped as the loops group one process's epoch: that shuffle, then steps of batch_size.
        steps = data.length_grouped_steps(order_random, lengths, args.batch_size, generator)
        order_grouped = [index for step in steps for index in step]
        b = args.batch_size
        pad = {
            "random": padding_share(lengths, [order_random[i : i + b] for i in range(0, len(lengths), b)]),
            "group_by_length": padding_share(lengths, [order_grouped[i : i + b] for i in range(0, len(lengths), b)]),
        }

        speeds: dict[str, list[float]] = {"random": [], "group_by_length": []}
        for round_index in range(args.rounds):
            for strategy in speeds:
                output_dir = workdir / f"out-{strategy}-{round_index}"
                speeds[strategy].append(train_once(project, data_dir, strategy, output_dir, args.batch_size))
                print(f"round {round_index + 1} {strategy:16s} {speeds[strategy][-1]:8.1f} samples/s", flush=True)

    median = {strategy: statistics.median(values) for strategy, values in speeds.items()}
    print(f"token lengths: median {statistics.median(lengths):.0f}, max {max(lengths)}, n={len(lengths)}")
    for strategy in speeds:
        print(f"{strategy:16s} median {median[strategy]:8.1f} samples/s, padding {pad[strategy]:.0%} of tokens")
    print(f"group_by_length / random: {median['group_by_length'] / median['random']:.2f}x")


if __name__ == "__main__":
    main()
