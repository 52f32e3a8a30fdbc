"""The seed guide's native DDP loop (example 2 of /work/shared/seed/), the benchmark's baseline row.

Kept as the guide wrote it, changed only so that it runs on CPU with local files and on today's
libraries; every change is marked `# bench:` with its reason. Launch it as the guide says:

    torchrun --nproc_per_node=2 bench/seed_loop.py MODEL_DIR TRAIN_JSONL
"""

import os
import sys

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.optim import AdamW  # bench: in place of transformers.AdamW, which transformers 5 removed
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoModelForSequenceClassification, AutoTokenizer

# bench: the local model folder and train file of the benchmark's workload, in place of the Hub's
# "bert-base-uncased" and "imdb".
MODEL_DIR, TRAIN_FILE = sys.argv[1], sys.argv[2]


def setup_ddp():
    dist.init_process_group(backend="gloo")  # bench: gloo, the CPU backend, in place of nccl
    local_rank = int(os.environ["LOCAL_RANK"])
    # bench: no torch.cuda.set_device(local_rank): there is no GPU.
    return local_rank


def cleanup_ddp():
    dist.destroy_process_group()


def main():
    local_rank = setup_ddp()  # noqa: F841 - bench: the guide moves the model and batches to it
    rank = dist.get_rank()
    world_size = dist.get_world_size()  # noqa: F841 - the guide's line, unused there too
    device = torch.device("cpu")  # bench: in place of local_rank, the guide's GPU

    # 加载并预处理数据
    dataset = load_dataset("json", data_files={"train": TRAIN_FILE})  # bench: local file, see above
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)

    def tokenize_func(examples):
        # Unchanged: pads every example to the tokenizer's model_max_length, 512 here as for
        # bert-base-uncased.
        return tokenizer(examples["text"], padding="max_length", truncation=True)

    tokenized_ds = dataset.map(tokenize_func, batched=True)
    # bench: the whole workload (1024 or more examples), not .select(range(1000)) of it.
    train_ds = tokenized_ds["train"].shuffle(seed=42)
    # bench: the guide passes the column "label", which transformers 5 models take into **kwargs
    # and ignore, so the loss is None and loss.backward() fails: the models expect "labels".
    train_ds = train_ds.rename_column("label", "labels")
    train_ds.set_format("torch", columns=["input_ids", "attention_mask", "labels"])

    # 分布式采样器
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=8, sampler=train_sampler)  # unchanged: 8 per process

    # 加载模型并包裹DDP
    model = AutoModelForSequenceClassification.from_pretrained(MODEL_DIR, num_labels=2).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model)  # bench: no device_ids on CPU

    # 优化器
    optimizer = AdamW(model.parameters(), lr=5e-5)

    # 训练循环
    num_epochs = 1  # bench: one epoch, the benchmark's workload, in place of 3
    model.train()
    for epoch in range(num_epochs):
        train_sampler.set_epoch(epoch)
        for step, batch in enumerate(train_loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            loss = outputs.loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

            # 仅在主进程（rank=0）打印日志
            if rank == 0 and step % 10 == 0:
                print(f"Epoch {epoch+1}/{num_epochs}, Step {step}/{len(train_loader)}, Loss: {loss.item():.4f}")

    cleanup_ddp()


if __name__ == "__main__":
    main()
