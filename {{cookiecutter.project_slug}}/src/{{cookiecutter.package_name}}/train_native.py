"""Fine-tune a sequence classifier with an explicit PyTorch DDP loop, on one process or under torchrun.

The run, top to bottom: parse the config and flags; join torchrun's process group; load and
tokenise the data; build the model (wrapped in DistributedDataParallel), the optimizer and the
learning-rate schedule; resume from the newest checkpoint; train with gradient accumulation,
clipping and mixed precision, saving checkpoints atomically; evaluate once over exactly the eval
set; write metrics.json. No Trainer and no accelerate: every step is here to read and change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import itertools
import json
import logging
import math
import os
import random
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import safetensors.torch
import torch
import torch.distributed as dist
import transformers
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Sampler
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler, set_seed
from transformers.integrations import is_kubeflow_available
from transformers.trainer_pt_utils import AcceleratorConfig

from .config import ConfigError, DataArguments, ModelArguments, TrainingArguments, parse_args
from .data import (
    ClassificationCollator,
    DistributedLengthGroupedSampler,
    build_collator,
    label_names,
    load_raw_datasets,
    tokenize_datasets,
)
from .distributed import (
    DistributedEnv,
    assert_gradients_synchronised,
    broadcast_from_main,
    check_really_distributed,
    cleanup_distributed,
    setup_or_adopt_distributed,
)
from .metrics import classification_metrics, write_metrics
from .modeling import load_model, load_tokenizer

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
TRAINING_STATE = "training_state.pt"  # written last: a checkpoint folder holding it is complete
DDP_OPTIONS = inspect.signature(DistributedDataParallel).parameters

# The TrainingArguments fields this loop reads. check_supported refuses a change to any other field:
# the loop would silently ignore it.
HONOURED_FIELDS = frozenset({
    # the run
    "output_dir", "resume_from_checkpoint", "num_train_epochs", "max_steps", "seed", "data_seed",
    "do_train", "do_eval",  # it always trains, then evaluates
    # data
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "train_sampling_strategy", "dataloader_drop_last", "dataloader_num_workers", "dataloader_pin_memory",
    "dataloader_persistent_workers", "dataloader_prefetch_factor", "dataloader_multiprocessing_context",
    # optimizer and schedule
    "optim", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps",
    # device, precision and DDP; TrainingArguments applies tf32 itself (a process-wide torch setting)
    "use_cpu", "mixed_precision", "fp16", "bf16", "tf32", "ddp_backend", "ddp_timeout",
    "ddp_find_unused_parameters", "ddp_bucket_cap_mb", "ddp_broadcast_buffers",
    "local_rank",  # set by older launchers; the loop reads LOCAL_RANK from the environment
    # logging, evaluation and checkpoints
    "logging_strategy", "logging_steps", "logging_first_step", "disable_tqdm", "report_to",
    "eval_strategy", "eval_steps", "save_strategy", "save_steps", "save_total_limit",
})
# Fields whose value TrainingArguments rewrites even when the user leaves them alone, so their
# dataclass default cannot tell: each maps to a test for "left alone".
REWRITTEN_FIELDS = {
    "activation_checkpointing": lambda args: not args.activation_checkpointing,  # None becomes False
    "gradient_checkpointing": lambda args: True,  # its old name, mirroring it: checked as the line above
    "debug": lambda args: not args.debug,  # "" becomes []
    # An AcceleratorConfig; config.py turns its seedable sampler off for the Trainer's sake.
    "accelerator_config": lambda args: args.accelerator_config is None or dataclasses.replace(
        args.accelerator_config, use_seedable_sampler=True) == AcceleratorConfig(use_seedable_sampler=True),
}
FLAG_NAMES = {"activation_checkpointing": "--activation_checkpointing (or --gradient_checkpointing)"}
LOGGERS = ("tensorboard",)
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch")
SCHEDULES_NEEDING_METRICS = ("reduce_lr_on_plateau", "greedy")  # their step() takes an eval metric


# --------------------------------------------------------------------------------------------
# The run, top to bottom: setup, build, resume, train, evaluate
# --------------------------------------------------------------------------------------------


def run(model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments) -> TrainingLoop:
    env = setup(training_args)
    try:
        loop = build_loop(env, model_args, data_args, training_args)
        train_and_evaluate(loop)
        return loop
    finally:
        cleanup_distributed()


def setup(training_args: TrainingArguments) -> DistributedEnv:
    """This rank's device and process group, from torchrun's RANK, LOCAL_RANK and WORLD_SIZE.

    Without torchrun this is one process and no group. Under torchrun, parsing TrainingArguments
    has already pinned this rank's GPU (config.py) and then started the group (transformers does it
    through accelerate). That group is adopted after checking that it spans torchrun's world, the
    device is pinned again (a no-op) and --ddp_timeout is applied to the group. Only where no
    group exists yet are the GPU pinned and the group started here.
    """
    return setup_or_adopt_distributed(training_args.use_cpu, training_args.ddp_backend, training_args.ddp_timeout)


def build_loop(env: DistributedEnv, model_args: ModelArguments, data_args: DataArguments,
               training_args: TrainingArguments) -> TrainingLoop:
    """Data, model, optimizer and schedule, ready to train; resumed if a checkpoint is there."""
    setup_logging(env)
    check_really_distributed(env.world_size)
    check_supported(training_args)
    logger.info("world size %d, device %s, backend %s, precision %s", env.world_size, env.device,
                dist.get_backend() if env.is_distributed else None,
                "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32")

    # The same seed on every rank: the same new classifier head and the same shuffles.
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(model_args)
    train_set, eval_set, names = build_datasets(model_args, data_args, training_args, tokenizer)
    collator = build_collator(tokenizer, mixed_precision=training_args.fp16 or training_args.bf16)
    train_sampler = build_train_sampler(train_set, training_args, env)
    train_loader = build_loader(train_set, training_args, collator, training_args.per_device_train_batch_size,
                                env, sampler=train_sampler)
    plan = plan_batches(len(train_set), train_loader, training_args, env.world_size)
    logger.info("%d steps of %d examples (%d per device x %d accumulation x %d processes), %d steps per epoch",
                plan.total_steps, plan.global_batch_size, plan.per_device_batch_size, plan.accumulation_steps,
                plan.world_size, plan.steps_per_epoch)

    # The optimizer is built over the DDP-wrapped model (inside TrainingLoop), after wrapping.
    model = build_model(model_args, names, training_args, env)
    loop = TrainingLoop(env, training_args, model, tokenizer, names, train_set, train_sampler, train_loader,
                        eval_set, collator, plan)
    # From here only dropout draws from the global RNG: give each rank its own stream, so the
    # ranks do not drop the same units (a checkpoint restores these per-rank states).
    set_seed(training_args.seed + env.rank)

    # Rank 0 picks the checkpoint, so all ranks resume from the same one.
    checkpoint = broadcast_from_main(find_resume_checkpoint(training_args))
    if checkpoint is not None:
        if not (Path(checkpoint) / TRAINING_STATE).is_file():
            raise ConfigError(f"rank {env.rank} cannot read {checkpoint}: --output_dir must be on a filesystem "
                              "every node shares")
        loop.load_checkpoint(Path(checkpoint))
    return loop


def train_and_evaluate(loop: TrainingLoop) -> dict[str, float]:
    """Train, save the final model, evaluate once over the whole eval set, write metrics.json."""
    train_metrics = loop.train()
    loop.save_model()
    loop.metrics = {**loop.evaluate(), **train_metrics}
    if loop.env.is_main_process:
        path = write_metrics(loop.args.output_dir, loop.metrics)
        logger.info("metrics written to %s: %s", path, loop.metrics)
    loop.finish()
    return loop.metrics


# --------------------------------------------------------------------------------------------
# The loop: one optimizer step per _run_batch, one epoch per _run_epoch
# --------------------------------------------------------------------------------------------


@dataclass
class Progress:
    """Where the run is; saved in every checkpoint and restored on resume."""

    global_step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0  # optimizer steps already taken in `epoch`


class TrainingLoop:
    """The training loop with everything it needs: one optimizer step per _run_batch call."""

    def __init__(
        self,
        env: DistributedEnv,
        training_args: TrainingArguments,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        names: list[str],
        train_set: datasets.Dataset,
        train_sampler: ResumableSampler,
        train_loader: DataLoader,
        eval_set: datasets.Dataset,
        collator: ClassificationCollator,
        plan: BatchPlan,
    ) -> None:
        self.env = env
        self.args = training_args
        self.model = model
        self.unwrapped: PreTrainedModel = model.module if isinstance(model, DistributedDataParallel) else model
        self.tokenizer = tokenizer
        self.names = names
        self.train_set = train_set
        self.train_sampler = train_sampler
        self.train_loader = train_loader
        self.eval_set = eval_set
        self.collator = collator
        self.plan = plan
        self.optimizer = build_optimizer(model, training_args)
        self.scheduler = get_scheduler(
            training_args.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=training_args.get_warmup_steps(plan.total_steps),
            num_training_steps=plan.total_steps,
            scheduler_specific_kwargs=training_args.lr_scheduler_kwargs,
        )
        # fp16 needs loss scaling to keep small gradients from flushing to zero; bf16 does not.
        self.scaler = torch.amp.GradScaler("cuda") if training_args.fp16 else None
        self.autocast_dtype = torch.bfloat16 if training_args.bf16 else torch.float16 if training_args.fp16 else None
        self.progress = Progress()
        self.resumed_from: str | None = None
        self.gradients_checked = False
        # Losses stay on the device between log steps: reading one back (.item()) would make the
        # CPU wait for the GPU at every step.
        self.window_loss = torch.zeros((), device=env.device)
        self.window_steps = 0
        self.window_samples = 0
        self.window_start = time.perf_counter()
        self.loss_total = 0.0  # sum of the rank-averaged step losses, over flushed windows
        self.run_steps = 0  # optimizer steps taken by this process (not counting resumed ones)
        self.run_samples = 0  # examples trained on in this process run, all ranks together
        self.grad_norm: torch.Tensor | None = None
        self.log_history: list[dict] = []  # every rank keeps it; only rank 0 prints it
        self.metrics: dict[str, float] = {}
        self.board = open_tensorboard(training_args, env)

    # ---- one optimizer step --------------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=self.autocast_dtype)

    def _run_batch(self, micro_batches: list[dict[str, torch.Tensor]]) -> None:
        """Forward and backward each micro-batch, then clip and take one optimizer step."""
        if not micro_batches:  # the batch plan promised this step's batches: a bug, not a user error
            raise RuntimeError(
                f"no micro-batches for step {self.progress.global_step + 1} (epoch {self.progress.epoch}, "
                f"after {self.progress.step_in_epoch} steps in it): the data loader ran out before the batch "
                "plan's end of epoch"
            )
        for index, batch in enumerate(micro_batches):
            batch = {key: value.to(self.env.device, non_blocking=True) for key, value in batch.items()}
            # DDP all-reduces gradients during backward. Between micro-steps that is wasted traffic:
            # no_sync() skips it, and the last micro-step's backward averages the accumulated sum.
            syncing = index == len(micro_batches) - 1 or not isinstance(self.model, DistributedDataParallel)
            with contextlib.nullcontext() if syncing else self.model.no_sync():
                with self.autocast():
                    # Each micro-batch loss is a batch mean; dividing by the micro-batch count makes
                    # the accumulated gradient the mean over the whole step, as one big batch would.
                    loss = self.model(**batch).loss / len(micro_batches)
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
            self.window_loss += loss.detach()
            self.window_samples += len(batch["labels"])

        if not self.gradients_checked:  # once: proves the ranks really share gradients
            assert_gradients_synchronised(self.unwrapped)
            self.gradients_checked = True
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        if self.args.max_grad_norm and self.args.max_grad_norm > 0:
            self.grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped when the unscaled gradients hold inf or nan
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    # ---- one epoch --------------------------------------------------------------------------

    def _run_epoch(self, bar: tqdm) -> None:
        epoch = self.progress.epoch
        # A new shuffle each epoch, the same on every rank. After a resume, the epoch's order is
        # replayed from just past the examples already trained on (every earlier batch was full).
        trained = self.progress.step_in_epoch * self.plan.accumulation_steps * self.plan.per_device_batch_size
        self.train_sampler.set_epoch(epoch, start=trained)
        batches = iter(self.train_loader)
        self.model.train()
        while self.progress.epoch == epoch and self.progress.global_step < self.plan.total_steps:
            micro_batches = list(itertools.islice(batches, self.plan.accumulation_steps))
            self._run_batch(micro_batches)
            self._advance()
            bar.update(1)
            self._after_step(bar)

    def _advance(self) -> None:
        self.progress.global_step += 1
        self.progress.step_in_epoch += 1
        self.run_steps += 1
        self.window_steps += 1
        if self.progress.step_in_epoch == self.plan.steps_per_epoch:
            self.progress.epoch += 1
            self.progress.step_in_epoch = 0

    def _after_step(self, bar: tqdm) -> None:
        step, end_of_epoch = self.progress.global_step, self.progress.step_in_epoch == 0
        last = step == self.plan.total_steps
        first_log = step == 1 and self.args.logging_first_step
        if self._due("logging", end_of_epoch) or first_log or last:
            self._log(bar)
        if self._due("eval", end_of_epoch) and not last:  # the final evaluation follows the loop
            self._log_metrics(self.evaluate())
            self.model.train()
        if self._due("save", end_of_epoch) or (last and self.args.save_strategy != "no"):
            self.save_checkpoint()

    def _due(self, kind: str, end_of_epoch: bool) -> bool:
        """Whether --{kind}_strategy asks for an action after this step."""
        strategy = getattr(self.args, f"{kind}_strategy")  # a str enum: compares equal to "steps"
        if strategy == "epoch":
            return end_of_epoch
        if strategy != "steps":
            return False
        interval = getattr(self.args, f"{kind}_steps") or self.args.logging_steps
        if interval < 1:  # a fraction of the run
            interval = math.ceil(interval * self.plan.total_steps)
        return self.progress.global_step % int(interval) == 0

    def train(self) -> dict[str, float]:
        start = self.window_start = time.perf_counter()
        bar = tqdm(total=self.plan.total_steps, initial=self.progress.global_step, desc="train",
                   disable=not self.env.is_main_process or bool(self.args.disable_tqdm), dynamic_ncols=True)
        while self.progress.global_step < self.plan.total_steps:
            self._run_epoch(bar)
        bar.close()
        runtime = time.perf_counter() - start
        self._flush_window()
        return {
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(self.run_samples / runtime, 3) if self.run_steps else 0.0,
            "train_steps_per_second": round(self.run_steps / runtime, 3) if self.run_steps else 0.0,
            "train_loss": self.loss_total / self.run_steps if self.run_steps else 0.0,
            "epoch": self.progress.global_step / self.plan.steps_per_epoch,
        }

    # ---- logging ----------------------------------------------------------------------------

    def _flush_window(self) -> tuple[float, int]:
        """Mean step loss and example count since the last flush, over all ranks: one all_reduce.

        This is the loop's only host-device sync besides checkpoints, so it runs at log steps only.
        """
        if self.window_steps == 0:
            return float("nan"), 0
        samples = torch.tensor(float(self.window_samples), device=self.env.device)
        stats = torch.stack([self.window_loss.float(), samples])
        if self.env.is_distributed:
            dist.all_reduce(stats)
        loss_sum, samples = stats.tolist()
        mean_loss = loss_sum / self.env.world_size / self.window_steps
        self.loss_total += mean_loss * self.window_steps
        self.run_samples += int(samples)
        self.window_loss.zero_()
        self.window_steps = self.window_samples = 0
        return mean_loss, int(samples)

    def _log(self, bar: tqdm) -> None:
        loss, samples = self._flush_window()
        now = time.perf_counter()
        logs = {
            "loss": round(loss, 4),
            "learning_rate": self.scheduler.get_last_lr()[0],
            "samples_per_second": round(samples / max(now - self.window_start, 1e-9), 1),
            "epoch": round(self.progress.global_step / self.plan.steps_per_epoch, 3),
        }
        if self.grad_norm is not None:
            logs["grad_norm"] = round(float(self.grad_norm), 4)  # the same on every rank after the all-reduce
        self.window_start = now
        bar.set_postfix(loss=logs["loss"], lr=f"{logs['learning_rate']:.2e}")
        self._log_metrics(logs, prefix="train/")

    def _log_metrics(self, logs: dict, prefix: str = "") -> None:
        self.log_history.append({"step": self.progress.global_step, **logs})
        if not self.env.is_main_process:
            return
        tqdm.write(json.dumps({"step": self.progress.global_step, **logs}))
        if self.board is not None:
            for key, value in logs.items():
                self.board.add_scalar(prefix + key, value, self.progress.global_step)

    # ---- evaluation -------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Accuracy, macro-F1 and loss over every eval example exactly once, whatever the world size.

        DistributedSampler would pad the eval set with repeats to share it evenly, and those would be
        counted twice. Instead rank r takes every world_size-th example of the length-sorted set (no
        repeats, similar lengths per batch), and rank 0 joins the ranks' predictions.
        """
        start = time.perf_counter()
        model = self.unwrapped  # not DDP: ranks may run different numbers of eval batches
        model.eval()
        by_length = np.argsort(-np.asarray(self.eval_set["length"]), kind="stable")
        shard = self.eval_set.select(by_length[self.env.rank :: self.env.world_size])
        loader = build_loader(shard, self.args, self.collator, self.args.per_device_eval_batch_size, self.env)
        predictions, labels, loss_sum = [], [], torch.zeros((), device=self.env.device)
        for batch in loader:
            batch = {key: value.to(self.env.device, non_blocking=True) for key, value in batch.items()}
            with self.autocast():
                output = model(**batch)
            loss_sum += output.loss.float() * len(batch["labels"])
            predictions.append(output.logits.argmax(dim=-1))
            labels.append(batch["labels"])
        local = (
            torch.cat(predictions).cpu().numpy() if predictions else np.empty(0, dtype=np.int64),
            torch.cat(labels).cpu().numpy() if labels else np.empty(0, dtype=np.int64),
            float(loss_sum),
        )
        if self.env.is_distributed:
            everyone = [None] * self.env.world_size
            dist.all_gather_object(everyone, local)
        else:
            everyone = [local]
        all_predictions = np.concatenate([p for p, _, _ in everyone])
        all_labels = np.concatenate([label for _, label, _ in everyone])
        metrics = classification_metrics(all_predictions, all_labels, len(self.names))
        metrics["loss"] = sum(loss for _, _, loss in everyone) / max(1, len(all_labels))
        runtime = time.perf_counter() - start
        metrics["runtime"] = round(runtime, 4)
        metrics["samples_per_second"] = round(len(all_labels) / runtime, 3)
        metrics = {f"eval_{key}": value for key, value in metrics.items()}
        metrics["epoch"] = self.progress.global_step / self.plan.steps_per_epoch
        return metrics

    # ---- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Write output_dir/checkpoint-N: rank 0 fills a temporary folder, then renames it in one step.

        A crash of the process mid-save leaves only the temporary folder, which resume ignores, never
        a broken newest checkpoint. (Nothing is fsynced: a power loss on some filesystems could still
        persist the rename before the data.) Every rank takes part: each sends its RNG state to rank 0.
        """
        rng_states = gather_to_main(rng_state(), self.env)
        if self.env.is_main_process:
            output_dir = Path(self.args.output_dir)
            final = output_dir / f"checkpoint-{self.progress.global_step}"
            if not final.exists():  # e.g. resumed from the last step: nothing new to save
                temporary = output_dir / f"tmp-checkpoint-{self.progress.global_step}"
                shutil.rmtree(temporary, ignore_errors=True)
                self.unwrapped.save_pretrained(temporary)
                self.tokenizer.save_pretrained(temporary)
                torch.save(self._training_state(rng_states), temporary / TRAINING_STATE)
                os.replace(temporary, final)
                self._rotate_checkpoints()
        if self.env.is_distributed:
            dist.barrier()  # nobody reads or rotates checkpoints until the new one is in place

    def _training_state(self, rng_states: list) -> dict:
        return {
            "global_step": self.progress.global_step,
            "epoch": self.progress.epoch,
            "step_in_epoch": self.progress.step_in_epoch,
            "batch_plan": self.plan.position_basis(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng_states": rng_states,  # one per rank, in rank order
            "labels": self.names,
            "model_type": self.unwrapped.config.model_type,
        }

    def _rotate_checkpoints(self) -> None:
        limit = self.args.save_total_limit
        if limit is None or limit <= 0:
            return
        for old in complete_checkpoints(self.args.output_dir)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)

    def load_checkpoint(self, checkpoint: Path) -> None:
        """Restore weights, optimizer, schedule, scaler, position in the data and this rank's RNG."""
        state = torch.load(checkpoint / TRAINING_STATE, map_location="cpu", weights_only=True)
        weights = load_model_weights(checkpoint)
        check_checkpoint_matches(checkpoint, state, weights, self.unwrapped, self.names)
        check_batch_plan_matches(checkpoint, state["batch_plan"], self.plan.position_basis())
        # strict=False: save_pretrained leaves out tied copies; check_checkpoint_matches refused strangers.
        self.unwrapped.load_state_dict(weights, strict=False)
        self.optimizer.load_state_dict(state["optimizer"])  # moves the moments onto the parameters' device
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.progress = Progress(state["global_step"], state["epoch"], state["step_in_epoch"])
        set_rng_state(state["rng_states"][self.env.rank])  # one per rank: the world size matched
        self.resumed_from = str(checkpoint)
        logger.info("resumed from %s at step %d (epoch %d, step %d in it)", checkpoint,
                    self.progress.global_step, self.progress.epoch, self.progress.step_in_epoch)

    def finish(self) -> None:
        """Close TensorBoard and drop the DDP wrapper, now that the ranks are done with each other.

        DDP holds the process group (in reference cycles). Alive past destroy_process_group, it is
        freed at interpreter exit, where gloo's threads can abort the process now and then.
        """
        if self.board is not None:
            self.board.close()
        self.model = self.unwrapped
        gc.collect()

    def save_model(self) -> None:
        """The final model and tokenizer in output_dir itself, as trainer.save_model() leaves them."""
        if self.env.is_main_process:
            self.unwrapped.save_pretrained(self.args.output_dir)
            self.tokenizer.save_pretrained(self.args.output_dir)
        if self.env.is_distributed:
            dist.barrier()


# --------------------------------------------------------------------------------------------
# Building blocks: logging, data, batch plan, model, optimizer
# --------------------------------------------------------------------------------------------


def setup_logging(env: DistributedEnv) -> None:
    """Log from rank 0; the other ranks report warnings and errors only."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    logger.setLevel(logging.INFO if env.is_main_process else logging.WARNING)
    transformers.utils.logging.set_verbosity(logging.WARNING if env.is_main_process else logging.ERROR)
    datasets.utils.logging.set_verbosity(logging.WARNING if env.is_main_process else logging.ERROR)
    if not env.is_main_process:
        datasets.disable_progress_bars()


def unsupported(flag: str, why: str = "", remedy: str = "implement it in train.py") -> ConfigError:
    return ConfigError(f"{flag} is not supported by the native loop{why}; use the Trainer variant or {remedy}")


def check_supported(training_args: TrainingArguments) -> None:
    """Refuse what this loop does not implement, rather than ignore it.

    A field outside HONOURED_FIELDS must keep its default. The honoured fields with values the loop
    lacks are checked first, so a flag the parent derives others from is the one named.
    """
    # transformers adds kubeflow by itself inside a Kubeflow TrainJob; this loop does not report there.
    ignored_loggers = ("kubeflow",) if is_kubeflow_available() else ()
    for name in training_args.report_to or []:
        if name not in LOGGERS + ignored_loggers:
            raise unsupported(f"--report_to {name}", ", which logs to tensorboard only")
    if training_args.optim not in OPTIMIZERS:
        raise unsupported(f"--optim {training_args.optim.value}", ", which builds torch.optim.AdamW "
                          "(adamw_torch_fused or adamw_torch)", remedy="change build_optimizer in train.py")
    if training_args.lr_scheduler_type in SCHEDULES_NEEDING_METRICS:
        raise unsupported(f"--lr_scheduler_type {training_args.lr_scheduler_type.value}",
                          ", which steps the schedule without eval metrics")
    if training_args.save_strategy == "best":
        raise unsupported("--save_strategy best", ", which saves by steps or epoch")
    if training_args.train_sampling_strategy not in ("group_by_length", "random", "sequential"):
        raise unsupported(f"--train_sampling_strategy {training_args.train_sampling_strategy}",
                          " (group_by_length, random or sequential)", remedy="change build_train_sampler in train.py")
    for field in dataclasses.fields(training_args):
        if field.name in HONOURED_FIELDS or not field.init:
            continue
        if field.name in REWRITTEN_FIELDS:
            left_alone = REWRITTEN_FIELDS[field.name](training_args)
        elif field.default is not dataclasses.MISSING:
            left_alone = getattr(training_args, field.name) == field.default
        elif field.default_factory is not dataclasses.MISSING:
            left_alone = getattr(training_args, field.name) == field.default_factory()
        else:
            continue  # required: there is no default to keep
        if not left_alone:
            raise unsupported(FLAG_NAMES.get(field.name, f"--{field.name}"))


def build_datasets(
    model_args: ModelArguments, data_args: DataArguments, training_args: TrainingArguments, tokenizer
) -> tuple[datasets.Dataset, datasets.Dataset, list[str]]:
    raw = load_raw_datasets(data_args, model_args.cache_dir, seed=training_args.seed)
    names = label_names(raw, data_args.label_column)
    tokenized = tokenize_datasets(raw, tokenizer, data_args, names)  # rank 0 first; the others read its cache
    logger.info("train examples: %d, eval examples: %d, labels: %s", len(tokenized["train"]),
                len(tokenized["validation"]), names)
    return tokenized["train"], tokenized["validation"], names


class ResumableSampler(Sampler[int]):
    """A distributed sampler whose epoch can start part-way, after the examples already trained on."""

    def __init__(self, sampler: DistributedSampler | DistributedLengthGroupedSampler) -> None:
        self.sampler = sampler
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.sampler.set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.start, None)

    def __len__(self) -> int:
        return len(self.sampler) - self.start


def build_train_sampler(train_set: datasets.Dataset, training_args: TrainingArguments,
                        env: DistributedEnv) -> ResumableSampler:
    """Each rank its own disjoint shard, reshuffled every epoch by set_epoch (seed + epoch)."""
    seed = training_args.data_seed if training_args.data_seed is not None else training_args.seed
    strategy = training_args.train_sampling_strategy
    if strategy == "group_by_length":
        return ResumableSampler(DistributedLengthGroupedSampler(
            train_set["length"],
            training_args.per_device_train_batch_size,
            num_replicas=env.world_size,
            rank=env.rank,
            seed=seed,
            drop_last=training_args.dataloader_drop_last,
        ))
    return ResumableSampler(DistributedSampler(  # random or sequential (check_supported refused the rest)
        train_set,
        num_replicas=env.world_size,
        rank=env.rank,
        shuffle=strategy == "random",
        seed=seed,
        drop_last=training_args.dataloader_drop_last,
    ))


def build_loader(dataset, training_args: TrainingArguments, collator, batch_size: int, env: DistributedEnv,
                 sampler: Sampler | None = None) -> DataLoader:
    workers = training_args.dataloader_num_workers
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collator,
        num_workers=workers,
        pin_memory=training_args.dataloader_pin_memory and env.device.type == "cuda",
        drop_last=training_args.dataloader_drop_last and sampler is not None,
        persistent_workers=workers > 0 and training_args.dataloader_persistent_workers,
        prefetch_factor=training_args.dataloader_prefetch_factor if workers > 0 else None,
        multiprocessing_context=training_args.dataloader_multiprocessing_context if workers > 0 else None,
        # Its own generator: starting an epoch then draws no numbers from the global RNG, which
        # stays dropout's alone, so a resumed run draws the same dropout masks as an uninterrupted one.
        generator=torch.Generator().manual_seed(training_args.seed),
    )


@dataclass(frozen=True)
class BatchPlan:
    """How many examples make one optimizer step, and how many steps make the run."""

    per_device_batch_size: int
    accumulation_steps: int
    world_size: int
    train_size: int
    micro_batches_per_epoch: int  # per rank
    steps_per_epoch: int
    total_steps: int

    @property
    def global_batch_size(self) -> int:
        return self.per_device_batch_size * self.accumulation_steps * self.world_size

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.total_steps / self.steps_per_epoch)

    def position_basis(self) -> dict[str, int]:
        """What a checkpoint's place in its epoch is counted in; a resumed run must share all of it."""
        return {
            "per_device_train_batch_size": self.per_device_batch_size,
            "gradient_accumulation_steps": self.accumulation_steps,
            "world_size": self.world_size,
            "train_size": self.train_size,
            "batches_per_epoch": self.micro_batches_per_epoch,
        }


def plan_batches(train_size: int, train_loader: DataLoader, training_args: TrainingArguments,
                 world_size: int) -> BatchPlan:
    per_device = training_args.per_device_train_batch_size
    accumulation = training_args.gradient_accumulation_steps
    if train_size < per_device * world_size:
        raise ConfigError(
            f"the train set has {train_size} examples, fewer than one batch across all processes "
            f"(--per_device_train_batch_size {per_device} x WORLD_SIZE {world_size}); lower the batch size, "
            "start fewer processes or add data"
        )
    micro_batches = len(train_loader)
    if micro_batches == 0:
        raise ConfigError("each rank's shard is smaller than one batch and --dataloader_drop_last drops it; "
                          "lower --per_device_train_batch_size or unset --dataloader_drop_last")
    # A last optimizer step of the epoch with fewer micro-batches than the others is still taken.
    steps_per_epoch = math.ceil(micro_batches / accumulation)
    if training_args.max_steps > 0:
        total_steps = training_args.max_steps
    else:
        total_steps = math.ceil(training_args.num_train_epochs * steps_per_epoch)
    return BatchPlan(per_device, accumulation, world_size, train_size, micro_batches, steps_per_epoch, total_steps)


def build_model(model_args: ModelArguments, names: list[str], training_args: TrainingArguments,
                env: DistributedEnv) -> torch.nn.Module:
    """Load the model onto this rank's device; wrap it in DDP when there is more than one rank."""
    model = load_model(model_args, names).to(env.device)
    if not env.is_distributed:
        return model
    options = {}
    if training_args.ddp_bucket_cap_mb is not None:
        options["bucket_cap_mb"] = training_args.ddp_bucket_cap_mb
    # Buffers such as position ids never change in these models; syncing them before every forward
    # would cost a collective per micro-step for nothing. --ddp_broadcast_buffers true turns it on.
    # (torch 2.13 renamed the option; older versions call it broadcast_buffers.)
    sync_buffers = "forward_sync_buffers" if "forward_sync_buffers" in DDP_OPTIONS else "broadcast_buffers"
    options[sync_buffers] = bool(training_args.ddp_broadcast_buffers)
    return DistributedDataParallel(
        model,  # its constructor broadcasts rank 0's weights, so every rank starts identical
        device_ids=[env.local_rank] if env.device.type == "cuda" else None,
        find_unused_parameters=bool(training_args.ddp_find_unused_parameters),
        gradient_as_bucket_view=True,  # gradients live in the all-reduce buckets: no copy per step
        **options,
    )


def build_optimizer(model: torch.nn.Module, training_args: TrainingArguments) -> torch.optim.Optimizer:
    """AdamW over the DDP-wrapped parameters; no weight decay on biases and LayerNorm gains."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    # Matrices (weights, embeddings) decay; the 1-D parameters are exactly the biases and norms.
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": training_args.weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups,
        lr=training_args.learning_rate,
        betas=(training_args.adam_beta1, training_args.adam_beta2),
        eps=training_args.adam_epsilon,
        # Fused: one kernel updates every parameter. torch >= 2.4 has it on CUDA and on CPU, where it
        # also beats the per-parameter loop (compare a run with --optim adamw_torch).
        fused=training_args.optim == "adamw_torch_fused",
    )


def open_tensorboard(training_args: TrainingArguments, env: DistributedEnv):
    """A SummaryWriter on rank 0 under output_dir/runs when --report_to includes tensorboard."""
    report_to = training_args.report_to or []
    if not env.is_main_process or "tensorboard" not in report_to:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning("--report_to tensorboard: tensorboard is not installed (pip install tensorboard); not logging")
        return None
    log_dir = os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(training_args.output_dir, "runs")
    return SummaryWriter(log_dir=log_dir)


# --------------------------------------------------------------------------------------------
# Checkpoint files: find, check, RNG states, weights
# --------------------------------------------------------------------------------------------


def checkpoint_step(path: Path) -> int | None:
    match = CHECKPOINT_NAME.match(path.name)
    return int(match.group(1)) if match and (path / TRAINING_STATE).is_file() else None


def complete_checkpoints(output_dir: str) -> list[Path]:
    """checkpoint-N folders holding a training state, oldest first. Temporary folders never match."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(step, path) for path in folder.iterdir() if (step := checkpoint_step(path)) is not None]
    return [path for _, path in sorted(found)]


def find_resume_checkpoint(training_args: TrainingArguments) -> Path | None:
    """--resume_from_checkpoint if given, else the newest complete checkpoint in output_dir, else None."""
    if training_args.resume_from_checkpoint is not None:
        path = Path(training_args.resume_from_checkpoint)
        if not (path / TRAINING_STATE).is_file():
            raise ConfigError(
                f"--resume_from_checkpoint {str(path)!r}: no {TRAINING_STATE} there; pass a checkpoint-N folder "
                "written by this loop (or leave the flag out to resume from the newest one in --output_dir)"
            )
        return path
    checkpoints = complete_checkpoints(training_args.output_dir)
    return checkpoints[-1] if checkpoints else None


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


def gather_to_main(value: object, env: DistributedEnv) -> list[object] | None:
    """Every rank's value, in rank order, on rank 0 (None elsewhere)."""
    if not env.is_distributed:
        return [value]
    gathered = [None] * env.world_size if env.is_main_process else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def load_model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    index = checkpoint / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
        "model.safetensors"]
    weights = {}
    for name in files:
        weights.update(safetensors.torch.load_file(checkpoint / name, device="cpu"))
    return weights


def check_checkpoint_matches(checkpoint: Path, state: dict, weights: dict, model: PreTrainedModel,
                             names: list[str]) -> None:
    """Refuse to resume a different model or label set, which would otherwise fail obscurely or silently."""
    own = model.state_dict()
    mismatched = sorted(k for k, v in weights.items() if k not in own or own[k].shape != v.shape)
    if state["labels"] != names or state["model_type"] != model.config.model_type or mismatched:
        raise ConfigError(
            f"checkpoint {str(checkpoint)!r} holds a {state['model_type']} model for labels {state['labels']}, but "
            f"this run trains a {model.config.model_type} model for labels {names}"
            + (f" (different tensors: {', '.join(mismatched[:3])})" if mismatched else "")
            + ". Use a new --output_dir, or --resume_from_checkpoint with a checkpoint of this model and data."
        )


def describe_batch_plan(basis: dict[str, int]) -> str:
    processes = "1 process" if basis["world_size"] == 1 else f"{basis['world_size']} processes"
    return (f"--per_device_train_batch_size {basis['per_device_train_batch_size']}, --gradient_accumulation_steps "
            f"{basis['gradient_accumulation_steps']}, {processes} and {basis['train_size']} train examples "
            f"({basis['batches_per_epoch']} batches per process per epoch)")


def check_batch_plan_matches(checkpoint: Path, saved: dict[str, int], current: dict[str, int]) -> None:
    """Refuse to resume under another batch plan: the checkpoint's step in its epoch would point elsewhere.

    Under a plan with fewer batches per epoch it points past the end, and the run would go on to
    take its remaining steps on no data at all.
    """
    if saved != current:
        raise ConfigError(
            f"checkpoint {str(checkpoint)!r} was written by a run with {describe_batch_plan(saved)}, but this run "
            f"has {describe_batch_plan(current)}. Its place in the epoch only means something under its own batch "
            "plan: to continue it, run again with its settings; to train with these, use a new --output_dir "
            "(without --resume_from_checkpoint)."
        )


def main(argv: list[str] | None = None) -> None:
    try:
        run(*parse_args(argv))
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
