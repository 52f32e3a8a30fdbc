"""The Trainer's flags: transformers.TrainingArguments with this project's defaults, and device,
backend and precision decided before the Trainer sets up devices.

Parsing has no side effects: it only queries the GPUs (how many, which compute capability), so
that the preflight{% if cookiecutter.include_doctor %} and the doctor{% endif %} can parse the same flags in one process on a node of 8 GPUs. The run's
setup (train.py's prepare_run) pins this rank's GPU and starts the process group before transformers
sets up its devices, which it then adopts through accelerate.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import transformers
from transformers.integrations import get_reporting_integration_callbacks

#% if cookiecutter.experiment_tracker != "none"
from . import tracking
#% endif
from .config import ConfigError, check_training_settings, flag
from .device import training_device_settings
from .distributed import default_dataloader_workers
from .parallel import ParallelArguments

# transformers.trainer.TRAINER_STATE_NAME: the Trainer writes it into checkpoint-N after the weights, the
# optimizer and the RNG state, so a folder holding it is complete. (Not imported from there: the preflight
# would then import the whole Trainer.)
CHECKPOINT_LAST_FILE = "trainer_state.json"


# With the flags of parallel.py, where the model is spread over the processes.
@dataclass
class TrainingArguments(ParallelArguments, transformers.TrainingArguments):
    mixed_precision: str = flag("auto", "auto: bf16 on GPUs that support it, else fp16; fp32 on CPU. Or "
                                "bf16, fp16 (CUDA only), no.", ["auto", "bf16", "fp16", "no"])
    # Batches of similar length carry little padding. On imdb-like lengths padding fell from 56% of
    # all tokens to 6% and training ran 2.9x faster (the template's bench/length_grouping.py).
    train_sampling_strategy: str = flag("group_by_length", "Order of train examples.",
                                        ["random", "sequential", "group_by_length", "batch_rebalance"])
    do_train: bool = flag(True, "Train (false: only evaluate the loaded model).")
    do_eval: bool = flag(True, "Evaluate after training and write metrics.json.")
    # Searching for unused parameters costs a graph walk per step; those the forward never uses are frozen
    # at load instead (modeling.freeze_unused_parameters).
    ddp_find_unused_parameters: bool | None = flag(False, "For models whose forward skips other parameters "
                                                   "on other inputs; true also keeps unused ones trainable.")
    # Buffers such as position ids never change here: syncing them wastes a collective per micro-step.
    ddp_broadcast_buffers: bool | None = flag(False, "Sync buffers before each forward.")
    # The collator drops helper columns itself; keeping them lets the length sampler read "length".
    remove_unused_columns: bool = flag(False, "Drop columns the model does not take, before collation.")
    dataloader_num_workers: int | None = flag(None, "Loader processes per rank; None: this process's share "
                                              "of the CPUs less one, at most 4.")
    output_dir: str | None = flag("outputs", "Checkpoints, final model, metrics.json.")
    logging_steps: float = flag(10, "Log every N optimizer steps.")
    # On: each micro-step's loss is read on the host (nan? inf?), two waits for the GPU.
    logging_nan_inf_filter: bool = flag(False, "Log earlier losses' mean for a nan or inf one.")
    save_total_limit: int | None = flag(2, "Keep at most this many checkpoints.")
    parsing = False  # not a flag: True while __post_init__ runs (see device)

    def __post_init__(self) -> None:
        if self.disable_tqdm is None:  # bar fragments would fill log files (SLURM, nohup, kubectl logs)
            self.disable_tqdm = not sys.stderr.isatty()
        if not (self.do_train or self.do_eval):
            raise ConfigError("--do_train false and --do_eval false leave nothing to do; keep at least one")
        if self.dataloader_num_workers is None:
            self.dataloader_num_workers = default_dataloader_workers()
        check_training_settings(self)
        # Device, backend and precision, before the parent reads them: on a CPU-only machine the
        # Trainer trains each rank alone unless use_cpu is set, and gloo alone does not make the
        # ranks synchronise gradients.
        self.device_settings = training_device_settings(self)
        self.use_cpu = self.device_settings.use_cpu
        self.ddp_backend = self.device_settings.ddp_backend
        self.fp16 = self.device_settings.precision == "fp16"
        self.bf16 = self.device_settings.precision == "bf16"
        self.check_parallel_settings()
        self.parsing, do_eval = True, self.do_eval
        try:
            super().__post_init__()
            get_reporting_integration_callbacks(self.report_to)  # as the Trainer does, in every worker
            #% if cookiecutter.experiment_tracker != "none"
            tracking.check_installed(self.report_to)
            #% endif
        except ValueError as err:  # transformers' own checks of its flags: one error line, not a traceback
            raise ConfigError(str(err)) from None
        finally:
            self.parsing = False
        # The parent turns do_eval on whenever eval_strategy is not "no"; only train.py reads it, for the
        # final evaluation, which --do_eval false skips as its help says.
        self.do_eval = do_eval
        # The parent fills an attribute of this name from ACCELERATE_MIXED_PRECISION and hands it
        # to accelerate; keep it equal to what was resolved above.
        self.mixed_precision = self.device_settings.precision

    @property
    def device(self) -> torch.device | None:
        """This rank's device. None while parsing: transformers' __post_init__ reads it, and its first read
        sets the devices up, which the run's setup does instead (train.py's prepare_run)."""
        return None if self.parsing else super().device
