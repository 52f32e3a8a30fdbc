"""Run by the tests under torchrun: train for real, recording what this rank trained on and holds. Each
rank writes <output_dir>/probe/rank<RANK>.json (world size, the train indices it consumed in each epoch,
optimizer steps run, the checkpoint it resumed from, logged losses, the bytes of parameters DDP
all-reduces) and rank<RANK>.safetensors (its final weights)."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

from safetensors.torch import save_file
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback

PACKAGE = next(path.parent.name for path in (Path(__file__).resolve().parents[1] / "src").glob("*/__init__.py"))
train = importlib.import_module(f"{PACKAGE}.train")
config = importlib.import_module(f"{PACKAGE}.config")


class ShardRecorder(TrainerCallback):
    """Wraps the data collator to note each example's index, epoch by epoch, as it is trained on."""

    def __init__(self, collator) -> None:
        self.collator = collator
        self.epochs: list[list[int]] = []
        self.steps = 0

    def __call__(self, features: list[dict]) -> dict:
        if "sample_index" in features[0]:  # train batches only; eval has no such column
            self.epochs[-1].extend(feature.pop("sample_index") for feature in features)
        return self.collator(features)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.epochs.append([])

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def main() -> None:
    model_args, data_args, training_args = config.parse_args(train.TrainingArguments, sys.argv[1:])
    training_args.dataloader_num_workers = 0  # the recorder must run in this process, not in a loader worker
    train.prepare_run(training_args)
    trainer = train.build_trainer(model_args, data_args, training_args)
    recorder = ShardRecorder(trainer.data_collator)
    trainer.add_callback(recorder)
    trainer.data_collator = recorder
    trainer.train_dataset = trainer.train_dataset.add_column("sample_index", list(range(len(trainer.train_dataset))))
    resumed_from = train.find_resume_checkpoint(training_args)  # what train_and_evaluate will resume from
    train.train_and_evaluate(trainer, training_args, data_args.test_file)

    rank = int(os.environ.get("RANK", "0"))
    # The Trainer's DDP wrapper's own record of how it was built; none without DDP.
    wrapped = trainer.model_wrapped
    ddp = wrapped._get_ddp_logging_data() if isinstance(wrapped, DistributedDataParallel) else {}
    probe_dir = Path(training_args.output_dir) / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": rank,
        "world_size": trainer.args.world_size,
        "train_indices_per_epoch": [sorted(indices) for indices in recorder.epochs if indices],
        "steps_run": recorder.steps,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "logged_losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "ddp_parameter_bytes": ddp.get("total_parameter_size_bytes"),  # of the parameters it all-reduces
        "ddp_broadcast_buffers": ddp.get("broadcast_buffers"),  # 1: buffers synced before each forward
        "ddp_gradient_as_bucket_view": ddp.get("gradient_as_bucket_view"),  # 1: no copy to the buckets
    }
    (probe_dir / f"rank{rank}.json").write_text(json.dumps(record))
    state = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in trainer.model.state_dict().items()}
    save_file(state, probe_dir / f"rank{rank}.safetensors")
    train.release(trainer)


if __name__ == "__main__":
    main()
