"""The native loop's checkpoints: save (atomically), load and rotate (resume.py finds the newest).

output_dir/checkpoint-N holds the model and tokenizer (save_pretrained; with LoRA, the adapters and the
head but not the frozen base), batch_plan.json, and training_state.pt: the state_dict() of each part the
loop hands the Checkpointer (optimizer, schedule, scaler, and its own place in the data, log history and
time trained), every rank's RNG state, and the labels and model type a resume must match. As torchtitan's
checkpointer, it knows those parts only by state_dict() and load_state_dict(), and nothing of the loop.
Rank 0 fills tmp-checkpoint-N and renames it in one step, so a folder named checkpoint-N is complete.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import safetensors.torch
import torch
import torch.distributed as dist
from transformers import PreTrainedTokenizerBase

from . import resume
from .config import BATCH_PLAN, ConfigError, check_same_batch_plan
from .distributed import is_distributed
from .modeling import check_same_lora, is_lora, read_weights
from .training_args import CHECKPOINT_LAST_FILE as TRAINING_STATE

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's save_pretrained: a LoRA model's adapters and head


class Stateful(Protocol):
    """What a checkpoint saves and restores: torch's optimizers, schedules and GradScaler have these two."""

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@dataclass
class Checkpointer:
    """Writes the run into output_dir/checkpoint-<step> and reads it back. Every rank calls both."""

    output_dir: str | Path
    save_total_limit: int | None
    model: torch.nn.Module  # the model itself, not its DDP wrapper (with LoRA, in its peft wrapper)
    tokenizer: PreTrainedTokenizerBase
    labels: list[str]  # what this run trains for: a checkpoint of other labels is refused
    batch_plan: dict[str, int]  # BatchPlan.as_dict(): a checkpoint of another global batch is refused
    parts: dict[str, Stateful | None]  # saved by name; None where the run has none (the scaler outside fp16)
    position: Stateful  # the loop's place in the run: its keys stand at the top of training_state.pt

    def save(self, step: int) -> None:
        """Write checkpoint-<step>. Every rank takes part: each sends its RNG state to rank 0.

        A crash mid-save leaves only tmp-checkpoint-N, which resume ignores, never a broken newest
        checkpoint. (Nothing is fsynced: after a power loss some filesystems could keep the rename but
        not the data.)
        """
        rng_states = gather_rng_states()
        final = Path(self.output_dir, f"checkpoint-{step}")
        if rng_states is not None and not final.exists():  # rank 0; it exists after a resume at the last step
            temporary = final.with_name(f"tmp-{final.name}")
            shutil.rmtree(temporary, ignore_errors=True)
            self.model.save_pretrained(temporary)
            self.tokenizer.save_pretrained(temporary)
            # Also on its own: a resume reads it before it builds the loader (config.read_batch_plan).
            (temporary / BATCH_PLAN).write_text(json.dumps(self.batch_plan) + "\n")
            state = {name: None if part is None else part.state_dict() for name, part in self.parts.items()}
            state |= self.position.state_dict()
            state |= {"batch_plan": self.batch_plan, "rng_states": rng_states,  # one per rank, in rank order
                      "labels": self.labels, "model_type": self.model.config.model_type}
            torch.save(state, temporary / TRAINING_STATE)
            temporary.replace(final)
            rotate_checkpoints(self.output_dir, self.save_total_limit)
        if is_distributed():
            dist.barrier()  # nobody reads or rotates checkpoints until the new one is in place

    def load(self, checkpoint: Path) -> None:
        """Restore the weights, every part, the position and this rank's RNG; refuse another model or plan."""
        state = torch.load(checkpoint / TRAINING_STATE, map_location="cpu", weights_only=True)
        adapter = checkpoint / ADAPTER_WEIGHTS  # a LoRA run's
        weights = safetensors.torch.load_file(adapter) if adapter.is_file() else read_weights(checkpoint)
        self.check_same_model(checkpoint, state, weights)
        # Under a plan with fewer steps per epoch, the checkpoint's step in its epoch would point past the
        # end, and the run would take its remaining steps on no data at all. Only the split of the global
        # batch may differ.
        check_same_batch_plan(checkpoint, state["batch_plan"], self.batch_plan,
                              same=("global_batch_size", "train_size", "steps_per_epoch"), advice=(
                                  "Its place in the epoch only means something under its own batch plan: to "
                                  "continue it, run again with its settings; to train with these, use a new "
                                  "--output_dir (without --resume_from_checkpoint)."))
        load_trained_weights(self.model, weights)
        for name, part in self.parts.items():
            if part is not None and state[name] is not None:
                part.load_state_dict(state[name])  # the optimizer's moments go to the parameters' device
        self.position.load_state_dict(state)
        rank, world_size = (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)
        if len(state["rng_states"]) == world_size:  # one per rank; on another world size, fresh streams
            set_rng_state(state["rng_states"][rank])

    def check_same_model(self, checkpoint: Path, state: dict, weights: dict) -> None:
        """Refuse to resume a different model or label set, which would fail obscurely or silently."""
        check_same_lora(checkpoint, self.model.peft_config["default"].r if is_lora(self.model) else 0)
        own, model_type = trained_weights(self.model), self.model.config.model_type
        mismatched = sorted(k for k, v in weights.items() if k not in own or own[k].shape != v.shape)
        if state["labels"] != self.labels or state["model_type"] != model_type or mismatched:
            raise ConfigError(
                f"checkpoint {str(checkpoint)!r} holds a {state['model_type']} model for labels "
                f"{state['labels']}, but this run trains a {model_type} model for labels {self.labels}"
                + (f" (different tensors: {', '.join(mismatched[:3])})" if mismatched else "")
                + ". Use a new --output_dir, or --resume_from_checkpoint with a checkpoint of this model "
                "and data."
            )


def rotate_checkpoints(output_dir: str | Path, limit: int | None) -> None:
    if limit is not None and limit > 0:
        for old in resume.complete_checkpoints(output_dir, TRAINING_STATE)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)


def trained_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds: every weight; with LoRA only the adapters and the head, under peft's names."""
    if is_lora(model):
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(model)
    return model.state_dict()


def load_trained_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Load what trained_weights returned."""
    if is_lora(model):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
    else:
        # strict=False: save_pretrained leaves out tied copies; check_same_model compares the names first.
        model.load_state_dict(weights, strict=False)


def gather_rng_states() -> list[dict] | None:
    """Every rank's RNG state on rank 0, in rank order; None on the others (a collective: all call it)."""
    if not is_distributed():
        return [rng_state()]
    states = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(rng_state(), states, dst=0)
    return states


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    name, keys, position, has_gauss, gauss = np.random.get_state()
    state["numpy"] = (name, keys.tolist(), position, has_gauss, gauss)  # plain types load with weights_only
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    name, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), position, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
