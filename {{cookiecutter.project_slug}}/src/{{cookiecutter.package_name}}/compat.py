"""The private APIs this project relies on, where no public one does the same: each behind one function here,
named in its docstring, so that an upgrade that changes one breaks in one place; tests/test_compat.py fails,
naming the API, when one is gone or changed. Checked on the versions CHECKED_ON names (constraints.txt's)."""

from __future__ import annotations

import atexit
import inspect
import os
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#% if cookiecutter.training_loop == "native"
CHECKED_ON = "Python 3.11 and torch 2.13.0"
#% else
CHECKED_ON = "Python 3.11, torch 2.13.0, transformers 5.25.0 and accelerate 1.16.0"
# The private Trainer methods train.py's ClassificationTrainer overrides, with their parameters as checked: no
# public hook does what the overrides do. Were one renamed upstream, its override would be dead code and its
# fix silently gone; check_private_overrides stops the run instead.
TRAINER_OVERRIDES = {
    "_build_accelerator_args": ("self", "kwargs"),
    "_get_train_sampler": ("self", "train_dataset"),
    "_get_eval_sampler": ("self", "eval_dataset"),
    "_run_epoch": ("self", "model", "epoch", "train_dataloader", "steps_in_epoch",
                   "num_update_steps_per_epoch", "trial", "ignore_keys_for_eval", "start_time",
                   "resume_from_checkpoint", "epochs_trained", "steps_trained_in_current_epoch"),
}
#% endif
# torch's DataLoader forks its workers from its private _MultiProcessingDataLoaderIter, defined here.
LOADER_MODULE = os.path.join("torch", "utils", "data", "dataloader.py")


#% if cookiecutter.training_loop == "native"
def loss_scale(scaler: torch.amp.GradScaler) -> torch.Tensor:
    """A copy of the GradScaler's scale on its device, read without waiting for the GPU as get_scale() does:
    GradScaler._get_scale_async where it exists (None: not yet set), else get_scale()."""
    import torch  # here, not on top: the launcher (torchrun.py) imports this module before it needs torch

    scale = scaler._get_scale_async() if hasattr(scaler, "_get_scale_async") else None
    return scale.clone() if scale is not None else torch.tensor(scaler.get_scale())


def take_back_skipped_steps(scheduler: torch.optim.lr_scheduler.LRScheduler, skipped: torch.Tensor) -> None:
    """Set the schedule back over the `skipped` steps the GradScaler skipped since the last call (a step
    that changed no weight should not move it; until this call the rate runs those steps ahead). Through
    LRScheduler.last_epoch, the step count, which torch documents only as an argument: transformers'
    schedules are LambdaLRs, whose rate follows the step count alone."""
    scheduler.last_epoch -= int(skipped) + 1
    scheduler.step()
    skipped.zero_()


#% else
def check_private_overrides(trainer_class: type) -> None:
    """Refuse a transformers whose Trainer lacks one of TRAINER_OVERRIDES, which trainer_class overrides."""
    import transformers

    from .config import ConfigError

    missing = [name for name in TRAINER_OVERRIDES if not callable(getattr(transformers.Trainer, name, None))]
    if missing:
        raise ConfigError(
            f"transformers {transformers.__version__}: Trainer has no {', '.join(missing)}, which this "
            f"project's {trainer_class.__name__} overrides (train.py); its fix would be skipped. Checked on "
            f"{CHECKED_ON}: install the transformers version pyproject.toml allows, or port the override"
        )


def base_dataloader(loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
    """accelerate's DataLoaderShard.base_dataloader: the DataLoader that a prepared loader wraps, and that
    starts the workers; a loader accelerate did not wrap is its own."""
    return getattr(loader, "base_dataloader", loader)


#% endif
def attention_implementation(model: torch.nn.Module) -> str:
    """The attention kernel a transformers model runs (by default SDPA, where its architecture has it):
    PreTrainedConfig._attn_implementation, as transformers' own documentation reads it."""
    return model.config._attn_implementation or "eager"


def compile_counts() -> dict[str, int]:
    """The graphs torch.compile built in this process (--torch_compile), a backward
    counted with its forward, and how many were recompiles (new shapes or modes).
    torch._dynamo.utils.get_compilation_metrics keeps its last 64 entries: one per
    compiled function (with no operations: a wrapper's context manager), one per
    backward compiled later (with none either)."""

    from torch._dynamo.utils import get_compilation_metrics

    compiled = [entry for entry in get_compilation_metrics() if entry.graph_op_count]
    recompiled = [entry for entry in compiled if entry.recompile_reason is not None]
    return {"compiled_graphs": len(compiled), "recompiles": len(recompiled)}


def clear_exit_handlers() -> None:
    """atexit._clear: forget every exit handler registered in this process (atexit has no public way)."""
    atexit._clear()


def run_exit_handlers() -> None:
    """atexit._run_exitfuncs: run (and forget) the exit handlers now, as the interpreter's exit does."""
    atexit._run_exitfuncs()


def forking_loader_workers() -> bool:
    """Whether the fork under way (called from an os.register_at_fork hook) starts DataLoader workers: torch's
    loader iterator (LOADER_MODULE) is then on the stack."""
    stack = traceback.walk_stack(inspect.currentframe())
    return any(frame.f_code.co_filename.endswith(LOADER_MODULE) for frame, _ in stack)
