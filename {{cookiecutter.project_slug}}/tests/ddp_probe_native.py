"""Run by the tests under torchrun: train for real, recording what this rank trained on and holds.

Each rank writes <output_dir>/probe/rank<RANK>.json (world size, the train indices it consumed in
each epoch, sorted and in the order it fetched them, optimizer steps run, the checkpoint it resumed
from, logged losses and every log entry) and rank<RANK>.safetensors (its final weights).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import save_file

from {{ cookiecutter.package_name }} import train
from {{ cookiecutter.package_name }}.config import parse_args
from {{ cookiecutter.package_name }}.distributed import cleanup_distributed


class IndexRecorder:
    """Wraps the collator to note each example's index, epoch by epoch, in the order the loop fetches it."""

    def __init__(self, loop: train.TrainingLoop) -> None:
        self.loop = loop
        self.collator = loop.collator
        self.epochs: dict[int, list[int]] = {}

    def __call__(self, features: list[dict]) -> dict:
        # The loop fetches a step's micro-batches before it advances, so this is their epoch.
        indices = self.epochs.setdefault(self.loop.progress.epoch, [])
        indices.extend(feature.pop("sample_index") for feature in features)
        return self.collator(features)


def main() -> None:
    model_args, data_args, training_args = parse_args(sys.argv[1:])
    env = train.setup(training_args)
    try:
        loop = train.build_loop(env, model_args, data_args, training_args)
        # The same sampler over the same examples, plus an index column for the recorder.
        recorder = IndexRecorder(loop)
        indexed = loop.train_set.add_column("sample_index", list(range(len(loop.train_set))))
        loop.train_loader = train.build_loader(
            indexed, training_args, recorder, training_args.per_device_train_batch_size, env, loop.train_sampler
        )
        train.train_and_evaluate(loop)
    finally:
        cleanup_distributed()

    probe_dir = Path(training_args.output_dir) / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    fetched = [indices for _, indices in sorted(recorder.epochs.items()) if indices]
    record = {
        "rank": env.rank,
        "world_size": env.world_size,
        "train_indices_per_epoch": [sorted(indices) for indices in fetched],  # which examples (test_ddp.py)
        "train_order_per_epoch": fetched,  # and in which order (the resume tests)
        "steps_run": loop.run_steps,
        "resumed_from": loop.resumed_from,
        "logged_losses": [entry["loss"] for entry in loop.log_history if "loss" in entry],
        "log_history": loop.log_history,
    }
    (probe_dir / f"rank{env.rank}.json").write_text(json.dumps(record))
    state = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in loop.unwrapped.state_dict().items()}
    save_file(state, probe_dir / f"rank{env.rank}.safetensors")


if __name__ == "__main__":
    main()
