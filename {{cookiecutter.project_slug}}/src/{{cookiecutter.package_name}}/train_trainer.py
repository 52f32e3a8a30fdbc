"""Fine-tune a sequence classifier with the Hugging Face Trainer, on one process or under torchrun.

The run, top to bottom: pin this rank's GPU and join the process group, checking that the ranks really
share gradients; load and tokenise the data; load the model; train, resuming from the newest checkpoint;
evaluate over exactly the eval set; predict (--do_predict); write metrics.json.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate.utils import DistributedDataParallelKwargs
from torch.utils.data import Sampler
from transformers import EvalPrediction, Trainer, TrainerCallback, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

#% if cookiecutter.include_lora
from . import lora
#% endif
from .compat import base_dataloader, check_private_overrides
from .config import (
    BATCH_PLAN,
    DataArguments,
    ModelArguments,
    batch_split,
    check_batch_fits,
    parse_args,
)
from .data import Task, build_collator, length_grouped_steps, load_data
from .distributed import (
    agree_on_precision,
    cleanup_distributed,
    exit_on_config_error,
    is_distributed,
    length_sorted_shard,
    setup_logging,
    start_distributed,
)
from .metrics import (
    add_run_totals,
    finished_message,
    is_finished,
    task_metrics,
    whole_run_metrics,
    write_log_line,
)
from .modeling import check_labels_fit, load_model, load_tokenizer, parameter_counts
from .parallel import check_parallel_setup, parallelize, whole_weights
from .results import write_results
from .resume import accumulation_to_resume, agree_on_resume_checkpoint
from .stopping import StopRequest, keep_through_sigterm
from .torchrun import STOPPED_EXIT_CODE, TorchrunEnv
#% if cookiecutter.experiment_tracker != "none"
from .trackers import close_trackers, configure_trackers
#% endif
from .training_args import CHECKPOINT_LAST_FILE, TrainingArguments

RUN_TOTALS = "run_totals.json"  # time and examples trained up to this checkpoint, over every leg of the run
logger = logging.getLogger(f"{__package__}.train")  # not __name__: that is "__main__" under python -m
# transformers hands DDP --ddp_broadcast_buffers by the name torch 2.13 deprecates, with a FutureWarning per
# rank. False still means no sync before each forward, nor at the start: the ranks load the same buffers.
warnings.filterwarnings("ignore", r"`broadcast_buffers` is deprecated", FutureWarning)


def main(argv: list[str] | None = None) -> None:
    with exit_on_config_error():
        model_args, data_args, args = parse_args(TrainingArguments, argv)
        prepare_run(args)
        trainer = build_trainer(model_args, data_args, args)
        train_and_evaluate(trainer, args, data_args.test_file, data_args.preprocessing_num_workers)
    release(trainer)


def prepare_run(args: TrainingArguments) -> None:
    setup_logging(TorchrunEnv.read().is_main_process)
    # This rank's GPU pinned and the group joined (with --ddp_timeout, bound to that GPU) before transformers
    # sets up its devices at the first use of args.device: accelerate adopts both.
    start_distributed(args.device_settings, args.ddp_timeout)
    args.device  # noqa: B018 - a property, read for its effect
    agree_on_precision(args.device_settings.precision)
    check_really_distributed(args.world_size)
    check_parallel_setup(args)
    #% if cookiecutter.experiment_tracker != "none"
    configure_trackers(args.report_to, args.output_dir, args.process_index == 0)  # before the Trainer is built
    #% endif
    set_seed(args.seed)
    if args.do_train:
        args.gradient_accumulation_steps = accumulation_to_resume(
            find_resume_checkpoint(args), args.per_device_train_batch_size, args.gradient_accumulation_steps,
            args.world_size)


def check_really_distributed(world_size_in_use: int) -> None:
    """Fail loudly when torchrun started several processes but each would train alone."""
    expected = TorchrunEnv.read().world_size
    group_size = dist.get_world_size() if is_distributed() else 1
    if expected > 1 and (group_size != expected or world_size_in_use != expected):
        raise RuntimeError(
            f"WORLD_SIZE={expected} but this process would train with world size {world_size_in_use} "
            f"(process group size {group_size}): the ranks would not share gradients. "
            "On CPU pass --use_cpu true and --ddp_backend gloo; on GPU check that CUDA is visible to every rank."
        )


class StopOnSignal(TrainerCallback):
    """On SIGTERM (see stopping.StopRequest), save the step every rank reached and end training."""

    def __init__(self) -> None:
        self.request: StopRequest | None = None
        self.stopped = False

    def on_train_begin(self, args, state, control, **kwargs):
        self.request = StopRequest()  # here: every rank has joined the group

    def on_step_end(self, args, state, control, **kwargs):
        if self.request.agreed() and state.global_step < state.max_steps:  # a last step finishes the run instead
            self.stopped = control.should_save = control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopped:
            logger.info("stopped by SIGTERM at step %d, saved in checkpoint-%d: the same command resumes there",
                        state.global_step, state.global_step)

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped:  # saved at the stop already: no second save (or evaluation) of the same step at epoch end
            control.should_save = control.should_evaluate = False


class RecordRun(TrainerCallback):
    """Note in each checkpoint how the global batch was split, so a resume can be checked against it,
    and how long the run has trained so far, so a resumed run reports its whole length."""

    def __init__(self, earlier: dict | None = None) -> None:
        self.earlier, self.start_time, self.first_step = earlier, time.perf_counter(), 0
        self.saved: tuple[int, dict] | None = None  # the step and totals of the last checkpoint

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_time, self.first_step = time.perf_counter(), state.global_step

    def totals(self, args: TrainingArguments, state) -> dict:
        samples = (state.global_step - self.first_step) * args.train_batch_size * args.gradient_accumulation_steps
        return add_run_totals(self.earlier, time.perf_counter() - self.start_time, samples * args.world_size)

    def on_save(self, args, state, control, **kwargs):
        self.saved = state.global_step, self.totals(args, state)
        if state.is_world_process_zero:
            checkpoint = Path(args.output_dir, f"checkpoint-{state.global_step}")
            split = batch_split(args.world_size, args.per_device_train_batch_size, args.gradient_accumulation_steps)
            (checkpoint / BATCH_PLAN).write_text(json.dumps(split) + "\n")
            (checkpoint / RUN_TOTALS).write_text(json.dumps(self.saved[1]) + "\n")


class ComputeMetrics:
    """The Trainer's compute_metrics: the task's numbers for its logs; the latest per-class table and
    confusion matrix kept aside, for metrics.json."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.tables: dict = {}

    def __call__(self, prediction: EvalPrediction) -> dict[str, float]:
        logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
        task = self.task
        metrics = task_metrics(logits, prediction.label_ids, task.problem_type, task.label_names,
                               task.multi_label_threshold)
        self.tables = {f"eval_{key}": metrics.pop(key)
                       for key in ("per_class", "confusion_matrix") if key in metrics}
        return metrics


class JsonLogLines(TrainerCallback):
    """Each log as one JSON line from rank 0 (metrics.write_log_line, as the native loop writes them).

    (The Trainer's own printers format numbers as text and, without a progress bar, print on every node.)
    Also logs at every checkpoint and at the last step, as the native loop does: the logged losses
    then cover the whole run, and metrics.json's train_loss is their mean (whole_run_metrics).
    """

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save or state.global_step >= state.max_steps:
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero:
            write_log_line(state.global_step, logs)


class ProgressBar(ProgressCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        pass  # JsonLogLines writes them


class EpochSeededLengthGroupedSampler(Sampler[int]):
    """group_by_length: the native loop's steps (data.length_grouped_steps), seeded with (seed, epoch) at each
    epoch. Upstream's generator carries on across epochs and no checkpoint saves it: a resumed run would train
    on another order than the run it continues. accelerate deals the batches out to the ranks in turn."""

    def __init__(self, trainer: Trainer, lengths: list[int]) -> None:
        self.trainer, self.lengths = trainer, list(lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        args = self.trainer.args
        # state.epoch is the epoch about to start, or after a resume the fraction reached in it.
        generator = torch.Generator().manual_seed(args.seed + math.floor(self.trainer.state.epoch + 1e-6))
        order = torch.randperm(len(self.lengths), generator=generator).tolist()
        step = args.train_batch_size * args.gradient_accumulation_steps * args.world_size
        return itertools.chain.from_iterable(length_grouped_steps(order, self.lengths, step, generator))


def with_loader_workers_kept_through_sigterm(loader):
    """The loader, its workers started with stopping.keep_through_sigterm. accelerate's prepared loader
    wraps the DataLoader that starts them (base_dataloader): the worker_init_fn must be set on that one."""
    inner = base_dataloader(loader)
    inner.worker_init_fn = keep_through_sigterm(inner.worker_init_fn)
    return loader


class ClassificationTrainer(Trainer):
    # The private Trainer methods it overrides are named, and checked, in compat.TRAINER_OVERRIDES.

    def get_train_dataloader(self):
        return with_loader_workers_kept_through_sigterm(super().get_train_dataloader())

    def _build_accelerator_args(self, **kwargs):
        # DDP's gradients live in its all-reduce buckets, as in the native loop: no copy between the two.
        args = super()._build_accelerator_args(**kwargs)
        for handler in args["kwargs_handlers"]:
            if isinstance(handler, DistributedDataParallelKwargs):
                handler.gradient_as_bucket_view = True
        return args

    def get_eval_dataloader(self, eval_dataset=None):
        return with_loader_workers_kept_through_sigterm(super().get_eval_dataloader(eval_dataset))

    def _get_train_sampler(self, train_dataset=None):
        if self.args.train_sampling_strategy != "group_by_length":
            return super()._get_train_sampler(train_dataset)
        return EpochSeededLengthGroupedSampler(self, (train_dataset or self.train_dataset)["length"])

    def _get_eval_sampler(self, eval_dataset):
        # In order: build_trainer sorts the eval set longest first, so each batch pads little. Upstream's
        # group_by_length sorts within random megabatches only (of 4 batches on 128 rows: 42% more tokens).
        return None

    def evaluation_loop(self, *args, metric_key_prefix: str = "eval", **kwargs):
        # Upstream's eval loss averages each batch's mean, and on several processes the last batches are
        # filled up with repeats that their means keep (101 rows on 2 ranks: 0.19 for 0.22). The model's own
        # loss over exactly the eval set, from the gathered logits and labels, replaces it.
        output = super().evaluation_loop(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        if output.predictions is not None and output.label_ids is not None:
            predictions = output.predictions
            logits = torch.as_tensor(predictions[0] if isinstance(predictions, tuple) else predictions)
            labels = torch.as_tensor(output.label_ids)
            loss = self.model.loss_function(labels=labels, pooled_logits=logits, config=self.model.config)
            output.metrics[f"{metric_key_prefix}_loss"] = loss.item()
        return output

    def _run_epoch(self, *args, **kwargs):
        # Upstream checks for the last step only after taking one: resumed from a checkpoint at its
        # last step in mid-epoch (--max_steps, fractional epochs), it would train one step too many.
        if self.state.global_step < self.state.max_steps:
            return super()._run_epoch(*args, **kwargs)
        return None


def build_trainer(model_args: ModelArguments, data_args: DataArguments, args: TrainingArguments) -> Trainer:
    check_private_overrides(ClassificationTrainer)
    tokenizer = load_tokenizer(model_args)
    data = load_data(data_args, tokenizer, model_args.cache_dir, args.seed)
    if args.do_train:
        check_batch_fits(len(data.train), args.world_size, args.per_device_train_batch_size,
                         args.gradient_accumulation_steps)
    # Parameters the forward never uses are frozen, unless DDP is to search for them at every step.
    model = load_model(model_args, data.task, tokenizer, freeze_unused=not args.ddp_find_unused_parameters)
    parallel_check = parallelize(model, args)
    # Classification heads ignore num_items_in_batch and return a per-batch mean: else the Trainer would
    # scale the loss by the world size and not divide it by the accumulation steps.
    #% if cookiecutter.include_lora
    lora.classifier_of(model).accepts_loss_kwargs = False  # the Trainer reads it inside peft's wrapper
    #% else
    model.accepts_loss_kwargs = False
    #% endif
    # --torch_compile: batches of a few lengths (data.COMPILE_BUCKET), so a few graphs
    compiled_length = data.task.max_seq_length if args.torch_compile else None
    # --gradient_checkpointing: the Trainer turns it on itself, non-reentrant unless told otherwise.
    trainer = ClassificationTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        # Longest first, read in this order (_get_eval_sampler): the whole set as one length-sorted shard.
        eval_dataset=data.validation.select(length_sorted_shard(data.validation["length"], 0, 1)),
        processing_class=tokenizer,
        data_collator=build_collator(tokenizer, args.fp16 or args.bf16, compiled_length),
        compute_metrics=ComputeMetrics(data.task),
        callbacks=[parallel_check, StopOnSignal(), RecordRun(), JsonLogLines()],
    )
    trainer.remove_callback(PrinterCallback)
    if trainer.pop_callback(ProgressCallback) is not None:  # on a terminal, unless --disable_tqdm
        trainer.add_callback(ProgressBar)
    return trainer


def find_resume_checkpoint(args: TrainingArguments) -> Path | None:
    return agree_on_resume_checkpoint(args.resume_from_checkpoint, args.output_dir, CHECKPOINT_LAST_FILE)


def callback(trainer: Trainer, kind: type):
    return next(c for c in trainer.callback_handler.callbacks if isinstance(c, kind))


def train_and_evaluate(trainer: Trainer, args: TrainingArguments, test_file: str | None = None,
                       preprocessing_num_workers: int | None = None) -> dict[str, float]:
    metrics, record = {}, callback(trainer, RecordRun)
    if args.do_train:
        checkpoint = find_resume_checkpoint(args)
        if checkpoint is not None:
            # As the preflight does: a run may start without it (PREFLIGHT=0), or on another node's files.
            check_labels_fit(checkpoint, trainer.compute_metrics.task, "checkpoint", same_names=True)
            #% if cookiecutter.include_lora
            lora.check_same_rank(checkpoint, lora.rank_of(trainer.model))
            #% endif
            logger.info("resuming from checkpoint %s", checkpoint)
            totals = checkpoint / RUN_TOTALS
            record.earlier = json.loads(totals.read_text()) if totals.is_file() else None
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        if callback(trainer, StopOnSignal).stopped:
            if is_distributed():
                dist.barrier()  # every rank's share of the checkpoint (its RNG state) is written before any exits
            release(trainer)
            raise SystemExit(STOPPED_EXIT_CODE)
        steps_left = trainer.state.max_steps - record.first_step  # when this run started, from its checkpoint
        if checkpoint is not None and is_finished(args.output_dir, steps_left):
            logger.info(finished_message(args.output_dir, trainer.state.global_step))
            return {}
        state = trainer.state
        last_saved = record.saved and record.saved[0] == state.global_step
        totals = record.saved[1] if last_saved else record.totals(args, state)  # as a resume would count it
        metrics.update(whole_run_metrics(state.log_history, totals, state.global_step))
        metrics.update(parameter_counts(trainer.model))
        metrics["epoch"] = state.epoch
        trainer.save_model()
        #% if cookiecutter.include_lora
        lora.save_base(trainer.model, args.output_dir, trainer.is_world_process_zero())  # beside the adapter
        #% endif
        trainer.save_state()
    if args.do_eval:
        # Trainer's evaluation gathers with gather_for_metrics, which drops the examples the
        # distributed sampler repeats to even out the ranks: every example counts exactly once.
        metrics.update(trainer.evaluate())
        metrics.update(trainer.compute_metrics.tables)
    with whole_weights(trainer.model) if args.do_predict else contextlib.nullcontext():
        write_results(args, metrics, trainer.state.log_history, trainer.is_world_process_zero(), trainer.model,
                      trainer.processing_class, trainer.compute_metrics.task, test_file, args.device,
                      args.device_settings.precision, preprocessing_num_workers)
    return metrics


def release(trainer: Trainer) -> None:
    """Drop the Trainer's DDP wrapper, then the process group, so every rank exits cleanly."""
    trainer.accelerator.free_memory()
    trainer.model_wrapped = trainer.model
    #% if cookiecutter.experiment_tracker != "none"
    close_trackers()
    #% endif
    cleanup_distributed()


if __name__ == "__main__":
    main()
