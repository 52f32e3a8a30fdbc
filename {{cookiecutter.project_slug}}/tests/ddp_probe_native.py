"""Run by the tests under torchrun: train for real, recording what this rank trained on and holds. Each
rank writes <output_dir>/probe/rank<RANK>.json (world size, the train indices it consumed in each epoch,
sorted and in the order it fetched them, optimizer steps run, the checkpoint it resumed from, logged
losses, every log entry and the bytes of parameters DDP all-reduces) and rank<RANK>.safetensors (its final
weights)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel

PACKAGE = next(path.parent.name for path in (Path(__file__).resolve().parents[1] / "src").glob("*/__init__.py"))
train = importlib.import_module(f"{PACKAGE}.train")
batching = importlib.import_module(f"{PACKAGE}.batching")
resume = importlib.import_module(f"{PACKAGE}.resume")
config = importlib.import_module(f"{PACKAGE}.config")
distributed = importlib.import_module(f"{PACKAGE}.distributed")


class IndexRecorder:
    """Wraps the collator to note each example's index, epoch by epoch, in the order the loop fetches it."""

    def __init__(self, job) -> None:
        self.job = job
        self.collator = job.collator
        self.epochs: dict[int, list[int]] = {}

    def __call__(self, features: list[dict]) -> dict:
        # The loop fetches a step's micro-batches before it advances, so this is their epoch.
        self.epochs.setdefault(self.job.epoch, []).extend(feature.pop("sample_index") for feature in features)
        return self.collator(features)


def main() -> None:
    model_args, data_args, args = config.parse_args(train.TrainingArguments, sys.argv[1:])
    args.dataloader_num_workers = 0  # the recorder must run in this process, not in a loader worker
    complete = resume.complete_checkpoints(args.output_dir, train.TRAINING_STATE)
    resumed_from = args.resume_from_checkpoint or (complete[-1] if complete else None)
    env, device, precision = train.setup_distributed(args)
    try:
        job = train.build_job(env, device, precision, model_args, data_args, args)
        first_step = job.step
        # DDP's own record of how it was built; none without DDP.
        ddp = job.model._get_ddp_logging_data() if isinstance(job.model, DistributedDataParallel) else {}
        # The same sampler over the same examples, plus an index column for the recorder.
        recorder = IndexRecorder(job)
        indexed = job.data.train.add_column("sample_index", list(range(len(job.data.train))))
        job.train_loader = batching.build_loader(indexed, args, recorder, args.per_device_train_batch_size,
                                                 on_gpu=False, sampler=job.sampler)
        train.train_and_evaluate(job)
        history = job.history
    finally:
        distributed.cleanup_distributed()

    probe_dir = Path(args.output_dir) / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    fetched = [indices for _, indices in sorted(recorder.epochs.items()) if indices]
    record = {
        "rank": env.rank,
        "world_size": env.world_size,
        "train_indices_per_epoch": [sorted(indices) for indices in fetched],  # which examples (test_ddp.py)
        "train_order_per_epoch": fetched,  # and in which order (the resume tests)
        "steps_run": job.step - first_step,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "logged_losses": [entry["loss"] for entry in history if "loss" in entry],  # rank 0 logs; others: []
        "log_history": history,
        "ddp_parameter_bytes": ddp.get("total_parameter_size_bytes"),  # of the parameters it all-reduces
        "ddp_broadcast_buffers": ddp.get("broadcast_buffers"),  # 1: buffers synced before each forward
        "ddp_gradient_as_bucket_view": ddp.get("gradient_as_bucket_view"),  # 1: no copy to the buckets
    }
    (probe_dir / f"rank{env.rank}.json").write_text(json.dumps(record))
    state = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in job.module.state_dict().items()}
    save_file(state, probe_dir / f"rank{env.rank}.safetensors")


if __name__ == "__main__":
    main()
