"""The Trainer's flags: transformers.TrainingArguments with this project's defaults, and device,
backend and precision decided before the Trainer sets up devices.

Under torchrun, parsing these arguments starts the process group, here, before transformers would
start it through accelerate (which adopts this one): so that it has --ddp_timeout on CPU too and
this rank's GPU bound to it (device_id).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch.distributed as dist
import transformers

from .config import ConfigError
from .distributed import (
    agree_on_precision,
    default_dataloader_workers,
    env_world_size,
    resolve_device_settings,
    select_device,
    start_process_group,
)


@dataclass
class TrainingArguments(transformers.TrainingArguments):
    mixed_precision: str = field(
        default="auto",
        metadata={
            "help": "auto: bf16 on GPUs that support it, else fp16; fp32 on CPU. Or bf16, fp16 (CUDA only), no.",
            "choices": ["auto", "bf16", "fp16", "no"],
        },
    )
    # Batches of similar length carry little padding. On imdb-like lengths padding fell from 56% of
    # all tokens to 6% and training ran 2.9x faster (the template's bench/length_grouping.py).
    train_sampling_strategy: str = field(
        default="group_by_length",
        metadata={
            "help": "random, sequential, group_by_length or batch_rebalance.",
            "choices": ["random", "sequential", "group_by_length", "batch_rebalance"],
        },
    )
    do_train: bool = field(default=True, metadata={"help": "Train (false: only evaluate the loaded model)."})
    do_eval: bool = field(default=True, metadata={"help": "Evaluate after training and write metrics.json."})
    # BERT uses every parameter on every step; searching for unused ones costs a graph walk per step.
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "Passed to DistributedDataParallel(find_unused_parameters=...)."}
    )
    # The collator drops helper columns itself; keeping them lets the length sampler read "length".
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Drop dataset columns the model does not take, before collation."}
    )
    dataloader_num_workers: int | None = field(
        default=None, metadata={"help": "Loader processes per rank; None: this process's share of the CPUs, at most 4."}
    )
    output_dir: str | None = field(default="outputs", metadata={"help": "Checkpoints, final model, metrics.json."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N optimizer steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Keep at most this many checkpoints."})

    def __post_init__(self) -> None:
        if self.disable_tqdm is None:  # bar fragments would fill log files (SLURM, nohup, kubectl logs)
            self.disable_tqdm = not sys.stderr.isatty()
        if not (self.do_train or self.do_eval):
            raise ConfigError("--do_train false and --do_eval false leave nothing to do; keep at least one")
        if self.dataloader_num_workers is None:
            self.dataloader_num_workers = default_dataloader_workers()
        # Decide device, backend and precision before the parent sets up devices: on a CPU-only
        # machine the Trainer trains each rank alone unless use_cpu is set, and gloo alone does not
        # make the ranks synchronise gradients.
        device = select_device(self.use_cpu)  # pinned first: precision support is read from it
        settings = resolve_device_settings(self.mixed_precision, fp16=self.fp16, bf16=self.bf16,
                                           use_cpu=device.type == "cpu", ddp_backend=self.ddp_backend)
        self.use_cpu = settings.use_cpu
        self.ddp_backend = settings.ddp_backend
        self.fp16 = settings.precision == "fp16"
        self.bf16 = settings.precision == "bf16"
        if env_world_size() > 1 and not dist.is_initialized():
            start_process_group(settings.ddp_backend, self.ddp_timeout, device)
        super().__post_init__()
        agree_on_precision(settings.precision)
        # The parent fills an attribute of this name from ACCELERATE_MIXED_PRECISION and hands it
        # to accelerate; keep it equal to what was resolved above.
        self.mixed_precision = settings.precision
