"""Peak memory and speed per rank, with and without LoRA and gradient checkpointing, on one model.

    python bench/lora_memory.py [--repeats 1] [--json bench/results/lora_memory.json]

Renders the template once per training loop and saves one Llama-like decoder with
save_pretrained: Llama-2's vocabulary size (32000), 4 layers of width 384 (19.4M parameters, 7.1M
of them outside the embeddings), with the tiny Llama-like tokenizer of tests/support/tiny_decoders.py,
which has no pad token. Each row trains it through the rendered project's scripts/train_single_node.sh on 2 CPU
processes (gloo, fp32), one epoch of 192 imdb-like reviews (bench/workload.py) cut at 128 tokens,
8 per process per step: every weight trained, or LoRA (--lora_r 8, all linear layers, the head in
full), each without and with --gradient_checkpointing.

The columns come from bench/probe/ (see bench/benchmark.py), with the training code unchanged:
peak RSS per rank is each process's peak resident memory (ru_maxrss) at its exit, which includes
Python, torch and the loaded data (about 0.7 GiB before any model), so differences between rows
are what to read; samples/s counts the examples through the model in train mode over all ranks,
from the first train forward to the last optimizer step. On CPU only: GPU memory is not measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmark import machine, run_once
from workload import imdb_like_rows, render, smoke_module, tiny_decoders_module, write_jsonl

BENCH = Path(__file__).resolve().parent
MODEL_CONFIG = {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 4,
                "num_attention_heads": 12, "num_key_value_heads": 12, "max_position_embeddings": 512}
MAX_TOKENS = 128
BATCH_SIZE = 8
ROWS = {  # title: flags
    "every weight": [],
    "every weight, gradient checkpointing": ["--gradient_checkpointing", "true"],
    "LoRA r=8": ["--lora_r", "8"],
    "LoRA r=8, gradient checkpointing": ["--lora_r", "8", "--gradient_checkpointing", "true"],
}


def save_model(project: Path, folder: Path, seed: int = 0) -> int:
    """The Llama-like decoder and the tiny Llama tokenizer, via save_pretrained; returns the parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_decoders_module().build_decoder_tokenizer("llama", smoke_module(project).WORDS)
    tokenizer.model_max_length = MAX_TOKENS
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **MODEL_CONFIG)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.model.parameters())


def command(project: Path, data: Path, output_dir: Path, flags: list[str]) -> list[str]:
    return [str(project / "scripts" / "train_single_node.sh"),
            "--model_name_or_path", str(data / "model"),
            "--train_file", str(data / "train.jsonl"), "--validation_file", str(data / "validation.jsonl"),
            "--output_dir", str(output_dir), "--max_seq_length", str(MAX_TOKENS), "--num_train_epochs", "1",
            "--per_device_train_batch_size", str(BATCH_SIZE), "--save_strategy", "no", "--disable_tqdm", "true",
            *flags]


def markdown(results: dict[str, dict[str, dict]]) -> str:
    lines = ["| Loop | Row | Trainable parameters | Peak RSS per rank (MiB) | vs every weight | Samples/s | "
             "vs every weight | Samples per CPU s |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for loop, rows in results.items():
        base = rows["every weight"]
        for title, row in rows.items():
            rss = " / ".join(f"{value:.0f}" for value in row["peak_rss_mib"])
            lines.append(f"| {loop} | {title} | {row['trainable_parameters']:,} | {rss} "
                         f"| {max(row['peak_rss_mib']) - max(base['peak_rss_mib']):+.0f} "
                         f"| {row['samples_per_s']:.1f} | {row['samples_per_s'] / base['samples_per_s']:.2f}x "
                         f"| {row['samples_per_cpu_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="rounds; each runs every row once")
    parser.add_argument("--train_size", type=int, default=128)
    parser.add_argument("--json", type=Path, default=BENCH / "results" / "lora_memory.json")
    args = parser.parse_args()
    runs: dict[str, dict[str, list[dict]]] = {loop: {title: [] for title in ROWS} for loop in ("native", "trainer")}
    with tempfile.TemporaryDirectory(prefix="bench_lora_") as scratch:
        scratch = Path(scratch)
        projects = {loop: render(scratch / loop, training_loop=loop, include_lora=True) for loop in runs}
        data = scratch / "data"
        smoke = smoke_module(projects["native"])
        write_jsonl(data / "train.jsonl", imdb_like_rows(smoke, args.train_size, 0, 1000))
        write_jsonl(data / "validation.jsonl", imdb_like_rows(smoke, 32, 1, 1000))
        body_parameters = save_model(projects["native"], data / "model")
        for round_index in range(args.repeats):
            for loop, project in projects.items():
                for title, flags in ROWS.items():
                    run_dir = scratch / f"{loop}-{len(runs[loop][title])}-{title.replace(' ', '_')}"
                    run = run_once(f"{loop} {title}", command(project, data, run_dir / "output", flags), project,
                                   run_dir, 2)
                    metrics = json.loads((run_dir / "output" / "metrics.json").read_text())
                    run["trainable_parameters"] = metrics["trainable_parameters"]
                    run["total_parameters"] = metrics["total_parameters"]
                    runs[loop][title].append(run)
                    print(f"round {round_index + 1} {loop:7s} {title:38s} peak RSS {run['peak_rss_mib']} MiB, "
                          f"{run['samples_per_s']:.1f} samples/s", file=sys.stderr, flush=True)
    results = {loop: {title: {
        "trainable_parameters": row_runs[0]["trainable_parameters"],
        "total_parameters": row_runs[0]["total_parameters"],
        "peak_rss_mib": [statistics.median(ranks) for ranks in zip(*(r["peak_rss_mib"] for r in row_runs),
                                                                   strict=True)],
        "samples_per_s": statistics.median(r["samples_per_s"] for r in row_runs),
        "samples_per_cpu_s": statistics.median(r["samples_per_cpu_s"] for r in row_runs),
    } for title, row_runs in rows.items()} for loop, rows in runs.items()}
    host = machine()
    today = datetime.date.today().isoformat()
    print(f"{today}, {host['cpu_cores']} CPU cores ({host['cpu_model']}), no GPU; torch {host['torch']}, transformers "
          f"{host['transformers']}; median of {args.repeats} round(s); 2 processes, {args.train_size} train examples "
          f"x 1 epoch, {BATCH_SIZE} per process per step, {MAX_TOKENS} tokens; Llama-like model of "
          f"{next(iter(results['native'].values()))['total_parameters']:,} parameters ({body_parameters:,} in its "
          "body)\n")
    print(markdown(results))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": today, "machine": host, "model": MODEL_CONFIG, "max_tokens": MAX_TOKENS,
                                     "batch_size": BATCH_SIZE, "train_size": args.train_size,
                                     "repeats": args.repeats, "results": results, "runs": runs}, indent=1) + "\n")
    print(f"JSON written to {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
