"""The native loop's checkpoints: save (atomically), load and rotate (resume.py finds the newest).

output_dir/checkpoint-N holds the model and tokenizer (save_pretrained; with LoRA, the adapters and the
head but not the frozen base) and training_state.pt: the optimizer, schedule, scaler, position in the
data, every rank's RNG state, the log history and the time trained so far.
Rank 0 fills tmp-checkpoint-N and renames it in one step, so a folder named checkpoint-N is complete.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import safetensors.torch
import torch
import torch.distributed as dist

from . import resume
from .config import BATCH_PLAN, ConfigError, check_same_batch_plan
from .distributed import is_distributed
from .modeling import check_same_lora, is_lora, read_weights
from .training_args import CHECKPOINT_LAST_FILE as TRAINING_STATE

if TYPE_CHECKING:
    from .train import Job

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's save_pretrained: a LoRA model's adapters and head


def checkpoint_problem(path: Path) -> str | None:
    """What keeps `path` from being resumed, or None."""
    problem = resume.checkpoint_problem(path, TRAINING_STATE)
    if problem is None and not (path / BATCH_PLAN).is_file():
        return f"holds no {BATCH_PLAN}: an older version of this loop wrote it; resume it with that version"
    return problem


def save_checkpoint(job: Job) -> None:
    """Write output_dir/checkpoint-<step>. Every rank takes part: each sends its RNG state to rank 0.

    A crash mid-save leaves only tmp-checkpoint-N, which resume ignores, never a broken newest
    checkpoint. (Nothing is fsynced: after a power loss some filesystems could keep the rename but
    not the data.)
    """
    rng_states = [rng_state()]
    if is_distributed():
        rng_states = [None] * job.env.world_size if job.env.is_main_process else None
        dist.gather_object(rng_state(), rng_states, dst=0)
    output_dir = Path(job.args.output_dir)
    final = output_dir / f"checkpoint-{job.step}"
    if job.env.is_main_process and not final.exists():  # it exists after a resume at the last step
        temporary = output_dir / f"tmp-checkpoint-{job.step}"
        shutil.rmtree(temporary, ignore_errors=True)
        job.module.save_pretrained(temporary)
        job.tokenizer.save_pretrained(temporary)
        state = {
            "global_step": job.step,
            "epoch": job.epoch,
            "step_in_epoch": job.step_in_epoch,
            "batch_plan": job.plan.as_dict(),
            "optimizer": job.optimizer.state_dict(),
            "scheduler": job.scheduler.state_dict(),
            "scaler": job.scaler.state_dict() if job.scaler is not None else None,
            "rng_states": rng_states,  # one per rank, in rank order
            "labels": job.data.label_names,
            "model_type": job.module.config.model_type,
            "log_history": job.history,
            "run_totals": job.totals,  # time and examples trained so far, over every leg of the run
        }
        (temporary / BATCH_PLAN).write_text(json.dumps(state["batch_plan"]) + "\n")  # readable without the optimizer
        torch.save(state, temporary / TRAINING_STATE)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary.replace(final)
        rotate_checkpoints(output_dir, job.args.save_total_limit)
    if is_distributed():
        dist.barrier()  # nobody reads or rotates checkpoints until the new one is in place


def rotate_checkpoints(output_dir: Path, limit: int | None) -> None:
    if limit is not None and limit > 0:
        for old in resume.complete_checkpoints(output_dir, TRAINING_STATE)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(job: Job, checkpoint: Path) -> None:
    """Restore weights, optimizer, schedule, scaler, position in the data and this rank's RNG."""
    state = torch.load(checkpoint / TRAINING_STATE, map_location="cpu", weights_only=True)
    weights = load_model_weights(checkpoint)
    check_same_model(checkpoint, state, weights, job)
    # Under a plan with fewer steps per epoch, the checkpoint's step in its epoch would point past the end,
    # and the run would take its remaining steps on no data at all. Only the split of the global batch may differ.
    check_same_batch_plan(checkpoint, state["batch_plan"], job.plan.as_dict(),
                          same=("global_batch_size", "train_size", "steps_per_epoch"), advice=(
                              "Its place in the epoch only means something under its own batch plan: to continue it, "
                              "run again with its settings; to train with these, use a new --output_dir (without "
                              "--resume_from_checkpoint)."))
    load_trained_weights(job.module, weights)
    job.optimizer.load_state_dict(state["optimizer"])  # moves the moments onto the parameters' device
    job.scheduler.load_state_dict(state["scheduler"])
    if job.scaler is not None and state["scaler"] is not None:
        job.scaler.load_state_dict(state["scaler"])
    job.step, job.epoch, job.step_in_epoch = state["global_step"], state["epoch"], state["step_in_epoch"]
    job.history, job.totals = state["log_history"], state.get("run_totals", {})
    if len(state["rng_states"]) == job.env.world_size:  # one per rank; on another world size, fresh streams
        set_rng_state(state["rng_states"][job.env.rank])


def load_model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    if (checkpoint / ADAPTER_WEIGHTS).is_file():
        return safetensors.torch.load_file(checkpoint / ADAPTER_WEIGHTS, device="cpu")
    return read_weights(checkpoint)


def check_same_model(checkpoint: Path, state: dict, weights: dict, job: Job) -> None:
    """Refuse to resume a different model or label set, which would fail obscurely or silently."""
    check_same_lora(checkpoint, lora_rank(job.module))
    own, names, model_type = trained_weights(job.module), job.data.label_names, job.module.config.model_type
    mismatched = sorted(k for k, v in weights.items() if k not in own or own[k].shape != v.shape)
    if state["labels"] != names or state["model_type"] != model_type or mismatched:
        raise ConfigError(
            f"checkpoint {str(checkpoint)!r} holds a {state['model_type']} model for labels {state['labels']}, but "
            f"this run trains a {model_type} model for labels {names}"
            + (f" (different tensors: {', '.join(mismatched[:3])})" if mismatched else "")
            + ". Use a new --output_dir, or --resume_from_checkpoint with a checkpoint of this model and data."
        )


def lora_rank(model: torch.nn.Module) -> int:
    """The model's --lora_r: 0 without LoRA."""
    return model.peft_config["default"].r if is_lora(model) else 0


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
        # strict=False: save_pretrained leaves out tied copies; callers compare the names first.
        model.load_state_dict(weights, strict=False)


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
