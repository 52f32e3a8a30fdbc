"""Memory and speed per rank of the native loop on a model of about 100M parameters: DDP, FSDP and LoRA.

    python bench/fsdp_memory.py [--repeats 1] [--malloc_mmap_threshold BYTES] [--json FILE]

Renders the native loop and saves a BertForSequenceClassification of bert-base's shape built from a
config (12 layers of width 768, bert-base's vocabulary of 30522; 109M parameters) with the smoke
tokenizer (bench/workload.py). Each row trains it through the project's scripts/train_single_node.sh
on 2 CPU processes (gloo, fp32): 64 imdb-like reviews cut at 64 tokens, 8 per process per step (4
optimizer steps), no evaluation, the final model saved as usual. Rows: DDP (the default), --fsdp true,
LoRA r=8 under DDP, and LoRA r=8 with --fsdp true.

Two memory columns, both from bench/probe/ (the training code unchanged):
- parameters + gradients + AdamW state per rank: the bytes of the tensors this rank holds after the
  first optimizer step (bench_probe.held_bytes): every parameter (frozen ones too), its gradient and
  the optimizer's moments; under FSDP the rank's shards (DTensor.to_local()). This is the part FSDP
  divides by the number of ranks; the goal is FSDP <= 0.6x DDP.
- peak RSS per rank (ru_maxrss at exit), which also holds Python, torch and the data (about 0.7 GiB
  before any model), the activations, the model as loaded whole before it is sharded, and on rank 0
  the weights gathered once for the final save_pretrained.
samples/s counts the examples through the model in train mode over both ranks, from the first train
forward to the last optimizer step: on a shared 2-core machine a rough figure, memory is the point.

On CPU the resident memory also depends on glibc's allocator: by default a freed buffer of up to 32 MiB
(its dynamic mmap threshold) stays in the process's heap, and FSDP, which gathers and frees a block's
weights and gradients at every block, leaves more of them behind than DDP. --malloc_mmap_threshold
BYTES runs every row with MALLOC_MMAP_THRESHOLD_=BYTES (a fixed threshold: larger buffers go back to
the system when freed). GPU memory has torch's own caching allocator and is not measured here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmark import machine, run_once
from workload import imdb_like_rows, render, save_model, smoke_module, write_jsonl

BENCH = Path(__file__).resolve().parent
MODEL_CONFIG = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                "intermediate_size": 3072}
MAX_TOKENS = 64
BATCH_SIZE = 8
ROWS = {  # title: flags
    "DDP": [],
    "FSDP": ["--fsdp", "true"],
    "LoRA r=8, DDP": ["--lora_r", "8"],
    "LoRA r=8, FSDP": ["--lora_r", "8", "--fsdp", "true"],
}
MIB = 2**20


def command(project: Path, data: Path, output_dir: Path, flags: list[str]) -> list[str]:
    return [str(project / "scripts" / "train_single_node.sh"),
            "--model_name_or_path", str(data / "model"),
            "--train_file", str(data / "train.jsonl"), "--validation_file", str(data / "validation.jsonl"),
            "--output_dir", str(output_dir), "--max_seq_length", str(MAX_TOKENS), "--num_train_epochs", "1",
            "--per_device_train_batch_size", str(BATCH_SIZE), "--do_eval", "false", "--save_strategy", "no",
            "--disable_tqdm", "true", "--dataloader_num_workers", "0", *flags]


def held_mib(run_dir: Path) -> list[dict[str, float]]:
    """Per rank: MiB of parameters, gradients and optimizer state, and their sum (the probe's state_bytes)."""
    ranks = [json.loads(path.read_text())["state_bytes"] for path in sorted((run_dir / "probe").glob("rank*.json"))]
    return [{key: value / MIB for key, value in rank.items()} | {"total": sum(rank.values()) / MIB} for rank in ranks]


def markdown(results: dict[str, dict]) -> str:
    base = results["DDP"]
    lines = ["| Row | Trainable parameters | Parameters + gradients + AdamW per rank (MiB) | vs DDP | "
             "Peak RSS per rank (MiB) | vs DDP | Samples/s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for title, row in results.items():
        held = max(row["held_total_mib"])
        parts = row["held_mib"][0]
        rss = " / ".join(f"{value:.0f}" for value in row["peak_rss_mib"])
        ratio = held / max(base["held_total_mib"])
        lines.append(f"| {title} | {row['trainable_parameters']:,} | {held:.0f} ({parts['parameters']:.0f} + "
                     f"{parts['gradients']:.0f} + {parts['optimizer']:.0f}) | {ratio:.2f}x "
                     f"| {rss} | {max(row['peak_rss_mib']) / max(base['peak_rss_mib']):.2f}x "
                     f"| {row['samples_per_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="rounds; each runs every row once")
    parser.add_argument("--train_size", type=int, default=64)
    parser.add_argument("--malloc_mmap_threshold", type=int, help="glibc's MALLOC_MMAP_THRESHOLD_ for every row")
    parser.add_argument("--json", type=Path, default=BENCH / "results" / "fsdp_memory.json")
    args = parser.parse_args()
    if args.malloc_mmap_threshold is not None:  # the rows' environment starts from this process's
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    runs: dict[str, list[dict]] = {title: [] for title in ROWS}
    with tempfile.TemporaryDirectory(prefix="bench_fsdp_") as scratch:
        scratch = Path(scratch)
        # With LoRA for the LoRA rows.
        project = render(scratch / "native", training_loop="native", include_fsdp=True, include_lora=True)
        data = scratch / "data"
        smoke = smoke_module(project)
        write_jsonl(data / "train.jsonl", imdb_like_rows(smoke, args.train_size, 0, 1000))
        write_jsonl(data / "validation.jsonl", imdb_like_rows(smoke, 16, 1, 1000))
        save_model(smoke, data / "model", MODEL_CONFIG, seed=0)
        for round_index in range(args.repeats):
            for title, flags in ROWS.items():
                run_dir = scratch / f"{len(runs[title])}-{title.replace(' ', '_').replace(',', '')}"
                run = run_once(title, command(project, data, run_dir / "output", flags), project, run_dir, 2)
                metrics = json.loads((run_dir / "output" / "metrics.json").read_text())
                run |= {"trainable_parameters": metrics["trainable_parameters"],
                        "total_parameters": metrics["total_parameters"], "held_mib": held_mib(run_dir)}
                runs[title].append(run)
                print(f"round {round_index + 1} {title:16s} held {[round(r['total']) for r in run['held_mib']]} MiB, "
                      f"peak RSS {run['peak_rss_mib']} MiB, {run['samples_per_s']:.2f} samples/s", file=sys.stderr,
                      flush=True)
    results = {title: {
        "trainable_parameters": row_runs[0]["trainable_parameters"],
        "total_parameters": row_runs[0]["total_parameters"],
        "held_mib": row_runs[0]["held_mib"],  # the same tensors every round
        "held_total_mib": [rank["total"] for rank in row_runs[0]["held_mib"]],
        "peak_rss_mib": [statistics.median(ranks) for ranks in zip(*(r["peak_rss_mib"] for r in row_runs),
                                                                   strict=True)],
        "samples_per_s": statistics.median(r["samples_per_s"] for r in row_runs),
    } for title, row_runs in runs.items()}
    host = machine()
    today = datetime.date.today().isoformat()
    print(f"{today}, {host['cpu_cores']} CPU cores ({host['cpu_model']}), no GPU; torch {host['torch']}, transformers "
          f"{host['transformers']}; median of {args.repeats} round(s); 2 processes (gloo, fp32), {args.train_size} "
          f"train examples x 1 epoch, {BATCH_SIZE} per process per step, {MAX_TOKENS} tokens; BERT of "
          f"{results['DDP']['total_parameters']:,} parameters; glibc's mmap threshold "
          f"{args.malloc_mmap_threshold or 'dynamic (the default)'}\n")
    print(markdown(results))
    goal = max(results["FSDP"]["held_total_mib"]) / max(results["DDP"]["held_total_mib"])
    print(f"\nFSDP holds {goal:.2f}x DDP's parameters, gradients and AdamW state per rank (goal: <= 0.6x)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": today, "machine": host, "model": MODEL_CONFIG, "max_tokens": MAX_TOKENS,
                                     "batch_size": BATCH_SIZE, "train_size": args.train_size,
                                     "malloc_mmap_threshold": args.malloc_mmap_threshold,
                                     "repeats": args.repeats, "results": results, "runs": runs}, indent=1) + "\n")
    print(f"JSON written to {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
