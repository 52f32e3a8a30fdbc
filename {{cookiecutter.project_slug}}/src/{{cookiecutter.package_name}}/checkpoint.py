"""The native loop's checkpoints: save (atomically), load and rotate (resume.py finds the newest).

output_dir/checkpoint-N holds model_and_optimizer/ (trainable weights and AdamW's state, through DCP, which
reshards on load), config, tokenizer, batch_plan.json and, written last, training_state.pt: the state_dict()
of each part the loop hands over (schedule, scaler, position), every rank's RNG state, labels, model type.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from transformers import PreTrainedTokenizerBase

#% if cookiecutter.include_lora
from . import lora, resume
#% else
from . import resume
#% endif
from .config import BATCH_PLAN, ConfigError, check_same_batch_plan, read_batch_plan
from .distributed import is_distributed
from .training_args import CHECKPOINT_LAST_FILE as TRAINING_STATE

SHARDED_STATE = "model_and_optimizer"  # DCP's folder in each checkpoint
# Frozen weights stay as loaded: not saved in every checkpoint, and so not loaded either (strict=False:
# check_same_model has compared every saved name and shape with this model's).
STATE_OPTIONS = StateDictOptions(ignore_frozen_params=True)
LOAD_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


@dataclass
class Checkpointer:
    """Writes the run into output_dir/checkpoint-<step> and reads it back. Every rank calls both."""

    output_dir: str | Path
    save_total_limit: int | None
    model: torch.nn.Module  # the model itself (as parallel.py leaves it), not a DDP wrapper
    optimizer: torch.optim.Optimizer  # saved with the model through DCP: its state is sharded as they are
    tokenizer: PreTrainedTokenizerBase
    labels: list[str]  # what this run trains for: a checkpoint of other labels is refused
    batch_plan: dict[str, int]  # BatchPlan.as_dict(): a checkpoint of another global batch is refused
    parts: dict[str, Stateful | None]  # schedule and scaler by name; None where the run has none
    position: Stateful  # the loop's place in the run: its keys stand at the top of training_state.pt

    def save(self, step: int) -> None:
        """Write checkpoint-<step>: every rank writes its shards into tmp-checkpoint-<step>, which rank 0
        renames once it is whole. A crash mid-save leaves a tmp- (or old-) folder, which resume ignores.
        (Nothing is fsynced.)"""
        rng_states = gather_rng_states()  # on rank 0; None on the others
        final = Path(self.output_dir, f"checkpoint-{step}")
        temporary = final.with_name(f"tmp-{final.name}")
        if rng_states is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        if is_distributed():
            dist.barrier()  # rank 0 removed the old tmp- folder before any rank writes into it
        # Returns once every rank's shards are written (without a process group: this one's).
        with without_dcp_notices():
            dcp.save(self.sharded_state(), checkpoint_id=temporary / SHARDED_STATE)
        if rng_states is not None:
            config = self.model.config  # config.json
            #% if cookiecutter.include_lora
            if lora.is_lora(self.model):  # adapter_config.json (its rank); no config.json: no model's weights
                config = self.model.peft_config["default"]
            #% endif
            config.save_pretrained(temporary)
            self.tokenizer.save_pretrained(temporary)
            # A resume reads it before it builds the loader (config.read_batch_plan).
            (temporary / BATCH_PLAN).write_text(json.dumps(self.batch_plan) + "\n")
            state = {name: None if part is None else part.state_dict() for name, part in self.parts.items()}
            state |= self.position.state_dict()
            state |= {"rng_states": rng_states,  # one per rank, in rank order
                      "labels": self.labels, "model_type": self.model.config.model_type}
            torch.save(state, temporary / TRAINING_STATE)
            # A run resumed from an earlier step reaches steps saved before: its own save replaces theirs.
            stale = final.with_name(f"old-{final.name}")
            shutil.rmtree(stale, ignore_errors=True)
            if final.exists():
                final.replace(stale)
            temporary.replace(final)
            shutil.rmtree(stale, ignore_errors=True)
            limit = self.save_total_limit
            if limit is not None and limit > 0:  # keep the newest `limit` checkpoints
                for old in resume.complete_checkpoints(self.output_dir, TRAINING_STATE)[:-limit]:
                    shutil.rmtree(old, ignore_errors=True)
        if is_distributed():
            dist.barrier()  # nobody reads or rotates checkpoints until the new one is in place

    def sharded_state(self) -> dict[str, dict]:
        """The weights and AdamW's state as DCP saves and loads them: this rank's part of them, named as
        the model names its parameters (never by a wrapper), so that any wrapping reads them back."""
        model, optimizer = get_state_dict(self.model, self.optimizer, options=STATE_OPTIONS)
        return {"model": model, "optimizer": optimizer}

    def load(self, checkpoint: Path) -> None:
        """Restore the weights, the optimizer, every part, the position and this rank's RNG; refuse another
        model or plan."""
        state = torch.load(checkpoint / TRAINING_STATE, map_location="cpu", weights_only=True)
        sharded = self.sharded_state()
        self.check_same_model(checkpoint, state, sharded["model"])
        # Only the split of the global batch may differ: its step in the epoch means nothing under another.
        check_same_batch_plan(checkpoint, read_batch_plan(checkpoint), self.batch_plan,
                              same=("global_batch_size", "train_size", "steps_per_epoch"),
                              advice=resume.OTHER_PLAN_ADVICE)
        with without_dcp_notices():
            dcp.load(sharded, checkpoint_id=checkpoint / SHARDED_STATE)  # this rank's shards
        set_state_dict(self.model, self.optimizer, model_state_dict=sharded["model"],
                       optim_state_dict=sharded["optimizer"], options=LOAD_OPTIONS)
        for name, part in self.parts.items():
            if part is not None and state[name] is not None:
                part.load_state_dict(state[name])
        self.position.load_state_dict(state)
        rank, world_size = (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)
        if len(state["rng_states"]) == world_size:  # one per rank; on another world size, fresh streams
            set_rng_state(state["rng_states"][rank])

    def check_same_model(self, checkpoint: Path, state: dict, weights: dict[str, torch.Tensor]) -> None:
        """Refuse to resume a different model or label set, which would fail obscurely or silently. The
        checkpoint's tensors are compared by name and whole shape, as DCP's metadata lists them."""
        #% if cookiecutter.include_lora
        lora.check_same_rank(checkpoint, lora.rank_of(self.model))
        #% endif
        metadata = dcp.FileSystemReader(checkpoint / SHARDED_STATE).read_metadata().state_dict_metadata
        saved = {name.removeprefix("model."): tuple(entry.size) for name, entry in metadata.items()
                 if name.startswith("model.")}
        own = {name: tuple(tensor.shape) for name, tensor in weights.items()}
        model_type = self.model.config.model_type
        mismatched = sorted(name for name in own.keys() | saved.keys() if own.get(name) != saved.get(name))
        if state["labels"] != self.labels or state["model_type"] != model_type or mismatched:
            raise ConfigError(
                f"checkpoint {str(checkpoint)!r} holds a {state['model_type']} model for labels "
                f"{state['labels']}, but this run trains a {model_type} model for labels {self.labels}"
                + (f" (different tensors: {', '.join(mismatched[:3])})" if mismatched else "")
                + ". Use a new --output_dir, or --resume_from_checkpoint with a checkpoint of this model "
                "and data."
            )


@contextlib.contextmanager
def without_dcp_notices():
    """Without DCP's warnings that ask nothing of the user: at every save and load without a process group,
    which a run of one process means to do; and (torch 2.8) about its own use of TypedStorage."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", r"torch\.distributed is (disabled, )?unavailable or uninitialized")
        warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
        yield


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
