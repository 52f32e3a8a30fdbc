"""The benchmark's compute limit: the same model stepping on pre-built batches of the workload's tokens.

    torchrun --nproc_per_node=2 bench/compute_limit.py MODEL_DIR TRAIN_JSONL [--batch_size 8] [--device cuda]

Before the first step: tokenise the train file with the model's tokenizer (truncated at 512
tokens, as the loops do), sort the examples by length, cut global batches of batch_size x
world_size consecutive examples (rank r takes slice r) and pad each rank's batch only to its own
longest example, the least padding any batching reaches; then shuffle the batch order (the same
on every rank) and build every tensor. The loop is only forward, backward (with DDP's all-reduce),
fused AdamW and zero_grad: no loader, no logging, no clipping, no schedule, no evaluation.
With --device cuda: one GPU a process (LOCAL_RANK's), nccl, the batches on the GPU before the first
step and bf16 autocast, as the loops train there (bench/gpu_check.py runs it so).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import AutoModelForSequenceClassification, AutoTokenizer

MAX_TOKENS = 512


def build_batches(model_dir: str, train_file: str, batch_size: int, rank: int, world_size: int) -> list[dict]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in Path(train_file).read_text().splitlines()]
    encoded = tokenizer([row["text"] for row in rows], truncation=True, max_length=MAX_TOKENS)
    examples = sorted(zip(encoded["input_ids"], encoded["token_type_ids"], (row["label"] for row in rows),
                          strict=True), key=lambda example: len(example[0]))
    global_batch = batch_size * world_size
    order = list(range(0, len(examples), global_batch))
    random.Random(0).shuffle(order)
    batches = []
    for start in order:
        group = examples[start : start + global_batch]
        if len(group) < world_size:  # a rank with no examples would leave the others waiting
            continue
        share = -(-len(group) // world_size)
        mine = group[rank * share : (rank + 1) * share] or group[-1:]
        width = max(len(ids) for ids, _, _ in mine)
        input_ids = torch.zeros(len(mine), width, dtype=torch.long)  # 0 is [PAD]
        token_type_ids = torch.zeros_like(input_ids)
        attention_mask = torch.zeros_like(input_ids)
        for row, (ids, types, _) in enumerate(mine):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            token_type_ids[row, : len(ids)] = torch.tensor(types)
            attention_mask[row, : len(ids)] = 1
        labels = torch.tensor([label for _, _, label in mine])
        batches.append({"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
                        "labels": labels})
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("train_file")
    parser.add_argument("--batch_size", type=int, default=8, help="examples per rank per step")
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    batches = [{name: tensor.to(device) for name, tensor in batch.items()}
               for batch in build_batches(args.model_dir, args.train_file, args.batch_size, rank, world_size)]
    module = AutoModelForSequenceClassification.from_pretrained(args.model_dir, dtype=torch.float32).to(device)
    # No buffer sync before each forward (torch 2.13 renamed the flag), gradients in DDP's buckets.
    sync_buffers = next(name for name in ("forward_sync_buffers", "broadcast_buffers")
                        if name in inspect.signature(DistributedDataParallel).parameters)
    model = DistributedDataParallel(module, gradient_as_bucket_view=True, **{sync_buffers: False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, fused=True)
    model.train()
    for batch in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keeps the gradients aliased to DDP's buckets
    del model
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
