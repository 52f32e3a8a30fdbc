"""The native loop's training flags: exactly what train.py implements, nothing else.

Names, meanings and defaults follow transformers.TrainingArguments, so a config file moves between this
loop and the Trainer variant; a flag that is not here is refused like any unknown flag. The defaults that
differ are this project's choices (output_dir, logging_steps, save_total_limit, as in the Trainer variant;
do_train and do_eval true; disable_tqdm and gradient_checkpointing false, not None), or a comment or their
help says why. tests/test_training_args.py checks the list.
"""

from __future__ import annotations

from dataclasses import dataclass

#% if cookiecutter.experiment_tracker != "none"
from . import tracking
#% endif
from .config import ConfigError, check_training_settings, flag
from .distributed import default_dataloader_workers
from .parallel import ParallelArguments

# checkpoint.py writes it last into checkpoint-N, after the weights: a folder holding it is complete.
CHECKPOINT_LAST_FILE = "training_state.pt"
STRATEGIES = ["no", "steps", "epoch"]
# transformers' schedules, less those whose step() wants an eval metric (reduce_lr_on_plateau, greedy).
SCHEDULES = ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
             "inverse_sqrt", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay"]


# With the flags of parallel.py, where the model is spread over the processes.
@dataclass
class TrainingArguments(ParallelArguments):
    # The run
    output_dir: str = flag("outputs", "Checkpoints, final model, metrics.json.")
    do_train: bool = flag(True, "Train (false: only evaluate).")
    do_eval: bool = flag(True, "Evaluate at the end, to metrics.json.")
    do_predict: bool = flag(False, "Predict --test_file at the end.")
    resume_from_checkpoint: str | None = flag(None, "checkpoint-N folder; default: newest.")
    num_train_epochs: float = flag(3.0, "Epochs to train.")
    max_steps: int = flag(-1, "Steps to train, if > 0 (wins over epochs).")
    seed: int = flag(42, "Seed for new weights, shuffles, dropout.")
    # Batches: one optimizer step = per-device batch x accumulation steps x processes
    per_device_train_batch_size: int = flag(8, "Examples per process per micro-step.")
    per_device_eval_batch_size: int = flag(8, "Eval examples per process per batch.")
    gradient_accumulation_steps: int = flag(1, "Micro-steps per optimizer step.")
    gradient_checkpointing: bool = flag(False, "Recompute activations: less memory.")
    # Differs from transformers: batches of similar length carry little padding (2.9x faster on
    # imdb-like lengths in the template's bench/length_grouping.py).
    train_sampling_strategy: str = flag("group_by_length", "Order of train examples.",
                                        ["group_by_length", "random", "sequential"])
    dataloader_drop_last: bool = flag(False, "Drop each rank's last short batch.")
    dataloader_num_workers: int | None = flag(None, "Loader processes per rank; None: CPU share - 1, <= 4.")
    dataloader_pin_memory: bool = flag(True, "Pinned memory for copies to the GPU.")
    dataloader_persistent_workers: bool = flag(False, "Keep loader processes alive.")
    # Optimizer and schedule
    optim: str = flag("adamw_torch_fused", "torch.optim.AdamW, fused or not.",
                      ["adamw_torch_fused", "adamw_torch"])
    learning_rate: float = flag(5e-5, "Peak learning rate.")
    weight_decay: float = flag(0.0, "AdamW decay (not biases, norms).")
    adam_beta1: float = flag(0.9, "AdamW beta1.")
    adam_beta2: float = flag(0.999, "AdamW beta2.")
    adam_epsilon: float = flag(1e-8, "AdamW epsilon.")
    max_grad_norm: float = flag(1.0, "Gradient norm clip; 0: off.")
    lr_scheduler_type: str = flag("linear", "Schedule after warmup.", SCHEDULES)
    lr_scheduler_kwargs: dict | str | None = flag(None, 'Settings, JSON: {"min_lr_rate": 0.1}.')
    warmup_steps: float = flag(0, "Warmup steps; < 1: fraction of all.")
    # Device, precision and DDP
    use_cpu: bool = flag(False, "Train on CPU even with a GPU.")
    mixed_precision: str = flag("auto", "auto: bf16, else fp16; fp32 on CPU.",
                                ["auto", "bf16", "fp16", "no"])
    fp16: bool = flag(False, "Same as --mixed_precision fp16.")
    bf16: bool = flag(False, "Same as --mixed_precision bf16.")
    tf32: bool | None = flag(None, "TF32 matmuls on Ampere+ GPUs.")
    torch_compile: bool = flag(False, "torch.compile; pads batches to 64s.")
    torch_compile_mode: str | None = flag(None, "None: torch.compile's default.",
                                          ["default", "reduce-overhead", "max-autotune"])
    ddp_backend: str | None = flag(None, "None: nccl on GPU, gloo on CPU.", ["nccl", "gloo"])
    ddp_timeout: int = flag(1800, "Seconds before a stuck collective fails.")
    # Both False, unlike transformers: each search or sync costs every step, while the parameters the forward
    # never uses are frozen at load instead, and BERT's buffers never change.
    ddp_find_unused_parameters: bool = flag(False, "For models that skip parameters by input.")
    ddp_broadcast_buffers: bool = flag(False, "Sync buffers before each forward.")
    ddp_bucket_cap_mb: int | None = flag(None, "DDP bucket MiB; None: torch's 25.")
    # Logging, evaluation and checkpoints; *_steps below 1 is a fraction of all steps
    logging_strategy: str = flag("steps", "When to log the train loss.", STRATEGIES)
    logging_steps: float = flag(10, "Log every N optimizer steps.")
    logging_first_step: bool = flag(False, "Also log after the first step.")
    disable_tqdm: bool = flag(False, "No progress bar.")
    #% if cookiecutter.experiment_tracker != "none"
    report_to: str = flag("none", "Tracker, offline in output_dir.", tracking.TRACKERS)
    #% endif
    eval_strategy: str = flag("no", "Eval during training (end: always).", STRATEGIES)
    eval_steps: float | None = flag(None, "Eval every N steps; None: logging_steps.")
    save_strategy: str = flag("steps", "When to save (end: always).", STRATEGIES)
    save_steps: float = flag(500, "Save every N optimizer steps.")
    save_total_limit: int | None = flag(2, "Keep at most this many checkpoints.")

    def __post_init__(self) -> None:
        if not (self.do_train or self.do_eval):
            raise ConfigError("--do_train false and --do_eval false leave nothing to do; keep at least one")
        if self.dataloader_num_workers is None:
            self.dataloader_num_workers = default_dataloader_workers()
        #% if cookiecutter.experiment_tracker != "none"
        tracking.check_installed([self.report_to])
        #% endif
        check_training_settings(self)
        self.check_parallel_settings()
