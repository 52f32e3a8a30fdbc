"""Fine-tune a sequence classifier with an explicit PyTorch DDP loop, on one process or under torchrun.

The run, top to bottom: join the process group; load and tokenise the data; build the model (spread over
the processes by parallel.py), optimizer and schedule; resume; train, each optimizer step written out in
`train`; evaluate over exactly the eval set; predict (--do_predict); write metrics.json.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase, get_scheduler, set_seed

#% if cookiecutter.include_lora
from . import lora
#% endif
from .batching import BatchPlan, ResumableSampler, build_loader, build_train_batches
from .checkpoint import TRAINING_STATE, Checkpointer
from .compat import loss_scale, take_back_skipped_steps
from .config import DataArguments, ModelArguments, parse_args
from .data import ClassificationCollator, ClassificationData, build_collator, load_data
from .device import autocast, training_device_settings
from .distributed import (
    agree_on_precision,
    cleanup_distributed,
    exit_on_config_error,
    setup_logging,
    sharded_forward,
    start_distributed,
)
from .metrics import (
    add_run_totals,
    finished_message,
    is_finished,
    #% if cookiecutter.experiment_tracker != "none"
    scalars,
    #% endif
    task_metrics,
    whole_run_metrics,
    write_log_line,
)
from .modeling import (
    check_gradient_checkpointing,
    load_model,
    load_tokenizer,
    parameter_counts,
)
from .parallel import (
    autocast_precision,
    check_gradients,
    final_weights,
    grad_scaler,
    gradient_sync,
    parallelize,
    whole_weights,
)
from .results import write_results
from .resume import agree_on_resume_checkpoint
from .stopping import StopRequest
from .torchrun import STOPPED_EXIT_CODE, TorchrunEnv
#% if cookiecutter.experiment_tracker != "none"
from .trackers import Tracker, start_tracker
#% endif
from .training_args import TrainingArguments

logger = logging.getLogger(f"{__package__}.train")  # not __name__: that is "__main__" under python -m
# A step the GradScaler skips calls no optimizer.step() (but with fused AdamW), yet the schedule steps, to be
# taken back at the next log line (take_back_skipped_steps): torch's warning about that order would mislead.
warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")


def main(argv: list[str] | None = None) -> None:
    with exit_on_config_error():
        model_args, data_args, args = parse_args(TrainingArguments, argv)
        env, device, precision = setup_distributed(args)
        try:
            train_and_evaluate(build_job(env, device, precision, model_args, data_args, args))
        finally:
            cleanup_distributed()


def setup_distributed(args: TrainingArguments) -> tuple[TorchrunEnv, torch.device, str]:
    """Which process this is, its device (pinned) and precision; the process group started (if torchrun's)."""
    env = TorchrunEnv.read()
    settings = training_device_settings(args)
    setup_logging(env.is_main_process)
    device = start_distributed(settings, args.ddp_timeout)
    if args.tf32 is not None and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    agree_on_precision(settings.precision)
    return env, device, settings.precision


@dataclass
class Job:
    """What the loop works on, and where it is."""

    args: TrainingArguments
    data_args: DataArguments  # test_file and preprocessing_num_workers, for --do_predict
    env: TorchrunEnv
    device: torch.device  # this rank's
    precision: str  # "bf16", "fp16" or "no"
    tokenizer: PreTrainedTokenizerBase
    data: ClassificationData
    collator: ClassificationCollator
    sampler: ResumableSampler
    train_loader: DataLoader
    plan: BatchPlan
    model: torch.nn.Module  # what the loop calls: parallel.parallelize's wrapper of module, or module itself
    module: torch.nn.Module  # the model itself, as load_model returned it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler | None  # fp16 only: loss scaling keeps small gradients from flushing to zero
    step: int = 0  # optimizer steps taken, over all runs of this job
    epoch: int = 0
    step_in_epoch: int = 0
    history: list[dict] = field(default_factory=list)  # the logged lines, also saved in checkpoints
    totals: dict = field(default_factory=dict)  # time and examples trained up to the last checkpoint
    stopped: bool = False  # by SIGTERM, at a step every rank reached (StopRequest)
    #% if cookiecutter.experiment_tracker != "none"
    tracker: Tracker | None = None  # --report_to's, on rank 0
    #% endif
    checkpointer: Checkpointer = field(init=False)  # saves the optimizer, schedule, scaler and state_dict()

    def state_dict(self) -> dict:
        """Where the run is, for its checkpoints (as torchtitan's trainer gives its checkpointer its own)."""
        return {"global_step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "log_history": self.history, "run_totals": self.totals}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.epoch = state["global_step"], state["epoch"]
        self.step_in_epoch = state["step_in_epoch"]
        self.history, self.totals = state["log_history"], state.get("run_totals", {})


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them. Non-reentrant, as
    the Trainer's default: the reentrant form sends no gradient through a layer whose inputs need none."""
    #% if cookiecutter.include_lora
    model = lora.classifier_of(model)  # inside peft's wrapper
    #% endif
    check_gradient_checkpointing(model)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def build_job(env: TorchrunEnv, device: torch.device, precision: str, model_args: ModelArguments,
              data_args: DataArguments, args: TrainingArguments) -> Job:
    # The same seed on every rank: the same new classifier head, the same shuffles.
    set_seed(args.seed)
    tokenizer = load_tokenizer(model_args)
    data = load_data(data_args, tokenizer, model_args.cache_dir, args.seed)
    collator = build_collator(tokenizer, mixed_precision=precision != "no",
                              compiled_length=data.task.max_seq_length if args.torch_compile else None)
    checkpoint = (agree_on_resume_checkpoint(args.resume_from_checkpoint, args.output_dir, TRAINING_STATE)
                  if args.do_train else None)
    sampler, train_loader, plan = build_train_batches(data.train, args, collator, env.rank, env.world_size,
                                                      device.type == "cuda", checkpoint)

    # Parameters the forward never uses are frozen, unless DDP is to search for them at every step.
    module = load_model(model_args, data.task, tokenizer, freeze_unused=not args.ddp_find_unused_parameters)
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(module)
    module = module.to(device)
    model = parallelize(module, args, env, device, precision)
    if args.torch_compile:  # in place: the state_dict keys, and so the checkpoints, stay the same
        module.compile(mode=args.torch_compile_mode)
    optimizer = build_optimizer(model, args)  # after parallelize: over the parameters this rank steps
    warmup = steps_of_run(args.warmup_steps, plan.total_steps)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, warmup, plan.total_steps,
                              scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    scaler = grad_scaler(model, precision)
    job = Job(args, data_args, env, device, precision, tokenizer, data, collator, sampler, train_loader, plan,
              model, module, optimizer, scheduler, scaler)
    #% if cookiecutter.experiment_tracker != "none"
    job.tracker = start_tracker(args.report_to, args.output_dir,
                                vars(model_args) | vars(data_args) | vars(args), env.is_main_process)
    #% endif
    parts = {"scheduler": scheduler, "scaler": scaler}
    job.checkpointer = Checkpointer(args.output_dir, args.save_total_limit, module, optimizer, tokenizer,
                                    data.label_names, plan.as_dict(), parts, position=job)

    # From here on only dropout draws from the global RNG: give each rank its own stream, so the
    # ranks do not drop the same units. A checkpoint restores these per-rank states.
    set_seed(args.seed + env.rank)
    if checkpoint is not None:
        job.checkpointer.load(checkpoint)
        logger.info("resumed from %s at step %d (epoch %d, step %d in it)", checkpoint, job.step, job.epoch,
                    job.step_in_epoch)
    return job


def build_optimizer(model: torch.nn.Module, args: TrainingArguments) -> torch.optim.Optimizer:
    """AdamW, with no weight decay on biases and LayerNorm gains (exactly the 1-D parameters)."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    # Fused: one kernel updates every parameter, on CUDA and on CPU (faster than --optim adamw_torch).
    return torch.optim.AdamW(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                             eps=args.adam_epsilon, fused=args.optim == "adamw_torch_fused")


# ---- the loop ------------------------------------------------------------------------------


def train_and_evaluate(job: Job) -> dict[str, float]:
    """Train, save the final model, evaluate once over the whole eval set, write metrics.json."""
    metrics, args = {}, job.args
    try:
        if args.do_train and is_finished(args.output_dir, job.plan.total_steps - job.step):
            logger.info(finished_message(args.output_dir, job.step))
            return {}
        if args.do_train:
            metrics.update(train(job) | parameter_counts(job.module))
            if job.stopped:  # by SIGTERM, after saving the step it reached
                logger.info("stopped by SIGTERM at step %d, saved in checkpoint-%d: the same command resumes "
                            "there", job.step, job.step)
                raise SystemExit(STOPPED_EXIT_CODE)
            save_final_model(job)
            #% if cookiecutter.include_lora
            lora.save_base(job.module, args.output_dir, job.env.is_main_process)  # beside the adapter
            #% endif
        if args.do_eval:
            metrics.update(evaluate(job))
            #% if cookiecutter.experiment_tracker != "none"
            if job.tracker is not None:  # the final evaluation too, as the Trainer's trackers get it
                job.tracker.log(scalars(metrics), job.step)
            #% endif
        with whole_weights(job.module) if args.do_predict else contextlib.nullcontext():  # as in evaluate
            write_results(args, metrics, job.history, job.env.is_main_process, job.module, job.tokenizer,
                          job.data.task, job.data_args.test_file, job.device, job.precision,
                          job.data_args.preprocessing_num_workers)
        return metrics
    finally:
        #% if cookiecutter.experiment_tracker != "none"
        if job.tracker is not None:
            job.tracker.close()
        #% endif
        job.model = job.module  # drop DDP, which holds the process group, before the group is destroyed


def save_final_model(job: Job) -> None:
    """The final model in output_dir itself (as the Trainer leaves it), for predict and pipeline()."""
    weights = final_weights(job.module)
    if job.env.is_main_process:
        job.module.save_pretrained(job.args.output_dir, state_dict=weights)  # None: the model's own
        job.tokenizer.save_pretrained(job.args.output_dir)


def train(job: Job) -> dict[str, float]:
    """The epoch loop. Each pass of the inner loop is one optimizer step over accumulated micro-batches."""
    args, plan, model, optimizer, scaler = job.args, job.plan, job.model, job.optimizer, job.scaler
    precision = autocast_precision(model, job.precision)
    meter, first_step, stop, earlier = LossMeter(job.device, job.step), job.step, StopRequest(), dict(job.totals)
    skipped = torch.zeros((), dtype=torch.int64, device=job.device)  # by the GradScaler, since the last log
    bar = tqdm(total=plan.total_steps, initial=job.step, desc="train", dynamic_ncols=True,  # no bars in files
               disable=not job.env.is_main_process or args.disable_tqdm or not sys.stderr.isatty())
    saving = False  # whether the step saves a checkpoint: then the run's totals are the checkpoint's
    while job.step < plan.total_steps and not job.stopped:
        # A new shuffle each epoch, the same on every rank. A resumed epoch starts just after the
        # examples already trained on (every earlier step of the epoch was full).
        epoch = job.epoch
        job.sampler.set_epoch(epoch, start=job.step_in_epoch * plan.accumulation_steps * plan.per_device_batch_size)
        batches = iter(job.train_loader)
        model.train()
        while job.epoch == epoch and job.step < plan.total_steps and not job.stopped:
            micro_batches = list(itertools.islice(batches, plan.accumulation_steps))
            if not micro_batches:  # the batch plan promised them: a bug here, not a user error
                raise RuntimeError(f"the train loader ran out before step {job.step + 1} (epoch {epoch})")
            examples = sum(len(batch["labels"]) for batch in micro_batches)  # this rank's: the same on all
            for index, batch in enumerate(micro_batches):
                batch = {key: value.to(job.device, non_blocking=True) for key, value in batch.items()}
                # Gradients sync during backward. Between micro-steps that is wasted traffic: it is off
                # then, and the last backward averages the accumulated sum.
                with gradient_sync(model, last=index == len(micro_batches) - 1):
                    with autocast(job.device, precision):
                        # A micro-batch mean, weighted by its share of the step's examples: the accumulated
                        # gradient is the step's mean, as one big batch gives, also with a short last batch.
                        loss = model(**batch).loss * (len(batch["labels"]) / examples)
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                meter.add(loss, len(batch["labels"]))
            if job.step == first_step:  # once per run: proves the ranks really share gradients
                check_gradients(job.module)
            if scaler is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            grad_norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                         if args.max_grad_norm > 0 else None)
            if scaler is not None:
                scale = loss_scale(scaler)
                scaler.step(optimizer)  # skipped when the unscaled gradients hold inf or nan ...
                scaler.update()
                skipped += loss_scale(scaler) < scale  # ... and then the scale drops
            else:
                optimizer.step()
            job.scheduler.step()  # taken back at the next log line if the scaler skipped this step
            optimizer.zero_grad(set_to_none=False)  # in place: see gradient_as_bucket_view in parallel.py
            job.step, job.step_in_epoch = job.step + 1, job.step_in_epoch + 1
            end_of_epoch = job.step_in_epoch == plan.steps_per_epoch
            if end_of_epoch:
                job.epoch, job.step_in_epoch = job.epoch + 1, 0
            bar.update(1)
            finished = job.step == plan.total_steps
            job.stopped = stop.agreed() and not finished  # a last step finishes the run instead
            saving = job.stopped or due(args.save_strategy, args.save_steps, job, end_of_epoch) or (
                finished and args.save_strategy != "no")
            # Also at each checkpoint and at the end: the logged windows then tile the run (whole_run_metrics).
            if due(args.logging_strategy, args.logging_steps, job, end_of_epoch) or finished or saving or (
                    job.step == 1 and args.logging_first_step):
                logs = meter.flush(job.step)  # the CPU waits for the GPU here: the time to read `skipped` too
                if scaler is not None:
                    take_back_skipped_steps(job.scheduler, skipped)
                logs["learning_rate"] = job.scheduler.get_last_lr()[0]
                if grad_norm is not None:
                    logs["grad_norm"] = round(float(grad_norm), 4)  # the same on every rank after the all-reduce
                log(job, logs)
            if due(args.eval_strategy, args.eval_steps or args.logging_steps, job, end_of_epoch) and not (
                    finished or job.stopped):
                log(job, evaluate(job))  # the final evaluation follows the loop
                model.train()
            if saving:
                job.totals = add_run_totals(earlier, *meter.trained())
                job.checkpointer.save(job.step)
    bar.close()
    totals = job.totals if saving else add_run_totals(earlier, *meter.trained())  # as a resume would count it
    return whole_run_metrics(job.history, totals, job.step) | {"epoch": job.step / plan.steps_per_epoch}


class LossMeter:
    """The running loss, summed on the device: reading it back at every step (.item()) would make the CPU
    wait for the GPU each time. flush() averages it over steps and ranks with one all_reduce."""

    def __init__(self, device: torch.device, step: int) -> None:
        self.window = torch.zeros(2, device=device)  # loss sum, examples, since the last flush
        self.step, self.start_time, self.samples = step, time.perf_counter(), 0

    def add(self, loss: torch.Tensor, samples: int) -> None:
        self.window[0] += loss.detach().float()
        self.window[1] += samples

    def flush(self, step: int) -> dict[str, float]:
        """The mean loss per step since the last flush, over every rank (a collective: call it on all)."""
        if dist.is_initialized():
            dist.all_reduce(self.window)
        (loss_sum, samples), steps = self.window.tolist(), step - self.step
        mean_loss = loss_sum / (dist.get_world_size() if dist.is_initialized() else 1) / steps
        self.samples += int(samples)
        self.window.zero_()
        self.step = step
        return {"loss": round(mean_loss, 4)}

    def trained(self) -> tuple[float, int]:
        """Seconds since this meter started, and examples (over all ranks) up to the last flush."""
        return time.perf_counter() - self.start_time, self.samples


def due(strategy: str, interval: float, job: Job, end_of_epoch: bool) -> bool:
    """Whether a --*_strategy asks for its action after this step."""
    if strategy == "epoch":
        return end_of_epoch
    if strategy != "steps":
        return False
    return job.step % steps_of_run(interval, job.plan.total_steps) == 0


def steps_of_run(value: float, total_steps: int) -> int:
    """A --*_steps flag's number of steps: below 1, a fraction of all steps, as transformers reads it."""
    return math.ceil(value * total_steps) if value < 1 else int(value)


def log(job: Job, logs: dict[str, float]) -> None:
    """One JSON line on rank 0, kept in job.history."""
    if not job.env.is_main_process:
        return
    epoch = {"epoch": round(job.step / job.plan.steps_per_epoch, 3)}
    #% if cookiecutter.experiment_tracker != "none"
    if job.tracker is not None:  # and a point for --report_to's tracker
        job.tracker.log(scalars(logs), job.step)
    #% endif
    job.history.append(write_log_line(job.step, epoch | logs))


def evaluate(job: Job) -> dict[str, float]:
    """The task's metrics and the loss over every eval example exactly once, whatever the world size
    (distributed.sharded_forward), on rank 0; the other ranks return {}."""
    start, args = time.perf_counter(), job.args
    batches = partial(build_loader, args=args, collator=job.collator,
                      batch_size=args.per_device_eval_batch_size, on_gpu=job.device.type == "cuda")
    # job.module, not its wrapper: the ranks may run different numbers of eval batches, on whole weights.
    with whole_weights(job.module):
        outputs = sharded_forward(job.module, job.data.validation, batches, job.device, job.precision)
    if outputs is None:
        return {}
    logits, labels, loss_sum = outputs
    task = job.data.task
    metrics = task_metrics(logits, labels, task.problem_type, task.label_names, task.multi_label_threshold)
    metrics["loss"] = loss_sum / max(1, len(labels))
    metrics["runtime"] = round(time.perf_counter() - start, 4)
    metrics["samples_per_second"] = round(len(labels) / metrics["runtime"], 3)
    return {f"eval_{key}": value for key, value in metrics.items()} | {"epoch": job.step / job.plan.steps_per_epoch}


if __name__ == "__main__":
    main()
