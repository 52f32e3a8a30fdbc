"""What only the native loop has to prove: exact resume, gradient accumulation, atomic checkpoints,
and refusing what it does not implement.

The torchrun runs (2 CPU processes, gloo) happen once per module; every test reads their records
(tests/ddp_probe.py writes one JSON and one safetensors file per rank).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.state import AcceleratorState
from conftest import EVAL_SIZE, REPO_ROOT, SMOKE_CONFIG, TRAIN_SIZE, run_env, smoke_flags, torchrun
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from {{ cookiecutter.package_name }}.config import ConfigError, TrainingArguments, parse_args
from {{ cookiecutter.package_name }}.data import DistributedLengthGroupedSampler
from {{ cookiecutter.package_name }}.metrics import classification_metrics
from {{ cookiecutter.package_name }}.train import (
    HONOURED_FIELDS,
    REWRITTEN_FIELDS,
    TRAINING_STATE,
    Progress,
    ResumableSampler,
    TrainingLoop,
    check_supported,
)

PROBE = str(REPO_ROOT / "tests" / "ddp_probe.py")
STEPS_PER_EPOCH = TRAIN_SIZE // (2 * 16)  # 2 ranks x per-device batch 16 (configs/smoke.yaml)
TOTAL_STEPS = 3 * STEPS_PER_EPOCH
INTERRUPTED_AT = TOTAL_STEPS - STEPS_PER_EPOCH // 2  # half-way through the last epoch
# Checkpoints every half epoch, the newest three kept: the interrupted step's survives.
CHECKPOINT_FLAGS = ["--max_steps", str(TOTAL_STEPS), "--save_strategy", "steps",
                    "--save_steps", str(STEPS_PER_EPOCH // 2), "--save_total_limit", "3"]
# Resuming replays the same operations in the same order, so the weights should agree to the bit;
# the tolerance only leaves room for a kernel that is not bitwise deterministic.
RESUME_ATOL = 1e-6
# Different batch shapes sum in a different order: float32 rounding, amplified a little by Adam's
# division by sqrt(v). After 6 steps the largest weight difference (`worst` in assert_weights_close)
# is 1.5e-7 on the smoke model; the bound leaves 60x room.
ACCUMULATION_ATOL = 1e-5
LOGGED_ATOL = 1.01e-4  # the loop logs loss and gradient norm rounded to 4 decimals


def read_probe(output_dir: Path, ranks: int = 2) -> list[dict]:
    return [json.loads((output_dir / "probe" / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def assert_weights_close(expected: dict, actual: dict, atol: float) -> None:
    assert expected.keys() == actual.keys()
    worst = max((expected[name] - actual[name]).abs().max().item() for name in expected)
    assert worst <= atol, f"largest weight difference {worst:.3g} > {atol}"


def run_single_process(args: list[str], script: str | None = None) -> subprocess.CompletedProcess:
    """Plain `python` without torchrun: the loop must run alone, as one process."""
    command = [sys.executable, script] if script else [sys.executable, "-m", "{{ cookiecutter.package_name }}.train"]
    return subprocess.run([*command, *args], cwd=REPO_ROOT, env=run_env(), capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output_dir = tmp_path_factory.mktemp("uninterrupted")
    torchrun([PROBE, *smoke_flags(smoke_assets, output_dir), *CHECKPOINT_FLAGS])
    return output_dir


@pytest.fixture(scope="module")
def resumed(uninterrupted: Path, smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run killed right after saving checkpoint-INTERRUPTED_AT, started again with the same flags.

    The interrupted run is the uninterrupted run's own checkpoint copied into a fresh folder: what
    a crash after that save would leave. (Stopping a run with a smaller --max_steps would not do:
    the learning-rate schedule decays over max_steps, so it would differ from the start.)
    """
    output_dir = tmp_path_factory.mktemp("resumed")
    shutil.copytree(uninterrupted / f"checkpoint-{INTERRUPTED_AT}", output_dir / f"checkpoint-{INTERRUPTED_AT}")
    torchrun([PROBE, *smoke_flags(smoke_assets, output_dir), *CHECKPOINT_FLAGS])
    return output_dir


# ---- resume ---------------------------------------------------------------------------------


def test_resumed_run_continues_mid_epoch_from_the_newest_checkpoint(resumed: Path) -> None:
    expected = str(resumed / f"checkpoint-{INTERRUPTED_AT}")
    assert [record["resumed_from"] for record in read_probe(resumed)] == [expected, expected]
    assert [record["steps_run"] for record in read_probe(resumed)] == [TOTAL_STEPS - INTERRUPTED_AT] * 2


def test_resumed_run_fetches_the_rest_of_the_interrupted_epoch_in_order(uninterrupted: Path, resumed: Path) -> None:
    """On each rank, exactly the batches the uninterrupted run fetched after the checkpoint, in its order.

    Order matters: an epoch restarted from its first batch, or reshuffled, would fetch other examples.
    """
    remaining = (TOTAL_STEPS - INTERRUPTED_AT) * 16
    for full, rest in zip(read_probe(uninterrupted), read_probe(resumed), strict=True):
        (resumed_order,) = rest["train_order_per_epoch"]
        last_epoch_order = full["train_order_per_epoch"][-1]
        assert len(last_epoch_order) == STEPS_PER_EPOCH * 16
        assert resumed_order == last_epoch_order[-remaining:], f"rank {rest['rank']}"


def test_resumed_run_ends_with_the_uninterrupted_weights(uninterrupted: Path, resumed: Path) -> None:
    expected = load_file(uninterrupted / "probe" / "rank0.safetensors")
    for rank in (0, 1):
        assert_weights_close(expected, load_file(resumed / "probe" / f"rank{rank}.safetensors"), RESUME_ATOL)


# ---- checkpoints ----------------------------------------------------------------------------


def test_checkpoints_rotate_to_the_newest_three(uninterrupted: Path) -> None:
    half = STEPS_PER_EPOCH // 2
    assert sorted(path.name for path in uninterrupted.glob("checkpoint-*")) == sorted(
        f"checkpoint-{step}" for step in (TOTAL_STEPS - 2 * half, TOTAL_STEPS - half, TOTAL_STEPS)
    )


def test_atomic_save_leaves_no_temporary_folder(uninterrupted: Path, resumed: Path) -> None:
    for output_dir in (uninterrupted, resumed):
        assert [path.name for path in output_dir.iterdir() if "tmp" in path.name] == []


def test_checkpoint_holds_model_tokenizer_and_every_ranks_training_state(uninterrupted: Path) -> None:
    checkpoint = uninterrupted / f"checkpoint-{INTERRUPTED_AT}"
    assert {path.name for path in checkpoint.iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", TRAINING_STATE
    }
    state = torch.load(checkpoint / TRAINING_STATE, map_location="cpu", weights_only=True)
    assert (state["global_step"], state["epoch"], state["step_in_epoch"]) == (
        INTERRUPTED_AT, INTERRUPTED_AT // STEPS_PER_EPOCH, INTERRUPTED_AT % STEPS_PER_EPOCH
    )
    assert state["batch_plan"] == {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1,
                                   "world_size": 2, "train_size": TRAIN_SIZE, "batches_per_epoch": STEPS_PER_EPOCH}
    assert state["labels"] == ["negative", "positive"]
    assert {"optimizer", "scheduler", "scaler"} <= state.keys()
    rank0, rank1 = state["rng_states"]
    assert not torch.equal(rank0["torch"], rank1["torch"]), "dropout streams should differ between ranks"


def test_final_model_sits_in_output_dir_like_the_trainer_variant(uninterrupted: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "metrics.json"):
        assert (uninterrupted / name).is_file(), name


# ---- evaluation -----------------------------------------------------------------------------


def test_distributed_eval_equals_a_single_process_eval(uninterrupted: Path, smoke_assets: Path) -> None:
    """Two ranks, 101 examples: the metrics must be exactly those of one process over all 101."""
    metrics = json.loads((uninterrupted / "metrics.json").read_text())
    rows = [json.loads(line) for line in (smoke_assets / "validation.jsonl").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(uninterrupted)
    model = AutoModelForSequenceClassification.from_pretrained(uninterrupted).eval()
    labels = torch.tensor([model.config.label2id[row["label"]] for row in rows])
    with torch.no_grad():
        output = model(**tokenizer([row["text"] for row in rows], padding=True, return_tensors="pt"), labels=labels)
    expected = classification_metrics(output.logits.argmax(-1).numpy(), labels.numpy(), num_labels=2)
    assert metrics["eval_num_examples"] == EVAL_SIZE
    assert metrics["eval_accuracy"] == expected["accuracy"]
    assert metrics["eval_f1_macro"] == pytest.approx(expected["f1_macro"], abs=1e-12)
    assert metrics["eval_loss"] == pytest.approx(output.loss.item(), abs=1e-5)


# ---- gradient accumulation ------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_dropout_assets(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke model without dropout, so two runs differ only in how they batch."""
    assets = tmp_path_factory.mktemp("no_dropout")
    shutil.copytree(smoke_assets / "tiny-bert", assets / "tiny-bert")
    for name in ("train.jsonl", "validation.jsonl"):
        shutil.copy(smoke_assets / name, assets / name)
    config_path = assets / "tiny-bert" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    config_path.write_text(json.dumps(config))
    return assets


# Sequential sampling: with 2 ranks, micro-batch k of rank r holds examples 2i + r, so one optimizer
# step of 2 ranks x 8 x 2 micro-batches covers examples 0-31, exactly the 1 rank x 32 batch.
# Adam barely notices a gradient scaled by a constant, so the logged loss and gradient norm (taken
# before clipping) are what catch a loss not divided by the accumulation steps or summed over ranks.
ACCUMULATION_FLAGS = ["--train_sampling_strategy", "sequential", "--max_steps", "6", "--logging_steps", "1",
                      "--save_strategy", "no"]


@pytest.fixture(scope="module")
def accumulated(no_dropout_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output_dir = tmp_path_factory.mktemp("two_ranks_accumulating")
    torchrun([PROBE, *smoke_flags(no_dropout_assets, output_dir), *ACCUMULATION_FLAGS,
              "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"])
    return output_dir


@pytest.fixture(scope="module")
def one_big_batch(no_dropout_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output_dir = tmp_path_factory.mktemp("one_rank_big_batch")
    result = run_single_process([*smoke_flags(no_dropout_assets, output_dir), *ACCUMULATION_FLAGS,
                                 "--per_device_train_batch_size", "32", "--gradient_accumulation_steps", "1"],
                                script=PROBE)
    assert result.returncode == 0, result.stderr[-4000:]
    return output_dir


def test_accumulation_over_two_ranks_matches_one_rank_with_the_whole_batch(accumulated: Path,
                                                                             one_big_batch: Path) -> None:
    (big,) = read_probe(one_big_batch, ranks=1)
    small = read_probe(accumulated)
    assert big["world_size"] == 1 and [record["world_size"] for record in small] == [2, 2]
    assert big["train_indices_per_epoch"][0] == sorted(small[0]["train_indices_per_epoch"][0]
                                                       + small[1]["train_indices_per_epoch"][0])
    assert small[0]["logged_losses"] == pytest.approx(big["logged_losses"], abs=LOGGED_ATOL)
    grad_norms = [[entry["grad_norm"] for entry in record["log_history"]] for record in (small[0], big)]
    assert len(grad_norms[0]) == 6 and grad_norms[0] == pytest.approx(grad_norms[1], abs=LOGGED_ATOL)
    small_loss, big_loss = (json.loads((run / "metrics.json").read_text())["train_loss"]
                            for run in (accumulated, one_big_batch))
    assert small_loss == pytest.approx(big_loss, abs=1e-6)
    assert_weights_close(load_file(one_big_batch / "probe" / "rank0.safetensors"),
                         load_file(accumulated / "probe" / "rank0.safetensors"), ACCUMULATION_ATOL)


# ---- refusals (single process: they fail before training) -----------------------------------


def test_refuses_a_checkpoint_of_a_different_label_set(uninterrupted: Path, smoke_assets: Path,
                                                       tmp_path: Path) -> None:
    for name in ("train.jsonl", "validation.jsonl"):
        rows = [json.loads(line) for line in (smoke_assets / name).read_text().splitlines()]
        rows[0]["label"] = "neutral"  # a third class
        (tmp_path / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    checkpoint = uninterrupted / f"checkpoint-{TOTAL_STEPS}"
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path / "out"),
                                 "--train_file", str(tmp_path / "train.jsonl"),
                                 "--validation_file", str(tmp_path / "validation.jsonl"),
                                 "--ignore_mismatched_sizes", "true",  # a fresh 3-class head, then the checkpoint
                                 "--resume_from_checkpoint", str(checkpoint)])
    assert result.returncode == 2
    assert "labels ['negative', 'positive']" in result.stderr
    assert "labels ['negative', 'neutral', 'positive']" in result.stderr


def test_refuses_to_resume_under_a_different_batch_plan(uninterrupted: Path, smoke_assets: Path,
                                                       tmp_path: Path) -> None:
    """A checkpoint's place in its epoch counts its own batches: step 4 of 8 (2 ranks x 16) is the end
    of a 1 x 64 epoch, so the resumed run would take all its remaining steps on no data at all."""
    output_dir = tmp_path / "out"
    checkpoint = output_dir / f"checkpoint-{INTERRUPTED_AT}"
    shutil.copytree(uninterrupted / checkpoint.name, checkpoint)
    result = run_single_process([*smoke_flags(smoke_assets, output_dir), "--per_device_train_batch_size", "64",
                                 "--max_steps", str(TOTAL_STEPS + 16)])
    assert result.returncode == 2, result.stdout[-3000:]
    plan = "--per_device_train_batch_size {}, --gradient_accumulation_steps 1, {} and {} train examples"
    saved, this = plan.format(16, "2 processes", TRAIN_SIZE), plan.format(64, "1 process", TRAIN_SIZE)
    assert f"checkpoint {str(checkpoint)!r} was written by a run with {saved}" in result.stderr
    assert f"but this run has {this}" in result.stderr
    assert "use a new --output_dir" in result.stderr
    assert [path.name for path in output_dir.iterdir()] == [checkpoint.name], "it trained anyway"


def test_a_step_without_micro_batches_is_an_internal_error() -> None:
    loop = SimpleNamespace(progress=Progress(global_step=20, epoch=2, step_in_epoch=4))
    with pytest.raises(RuntimeError, match="no micro-batches for step 21"):
        TrainingLoop._run_batch(loop, [])


def test_refuses_a_missing_checkpoint_path(smoke_assets: Path, tmp_path: Path) -> None:
    missing = tmp_path / "checkpoint-7"
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path / "out"),
                                 "--resume_from_checkpoint", str(missing)])
    assert result.returncode == 2
    assert f"--resume_from_checkpoint '{missing}'" in result.stderr


def test_refuses_a_batch_larger_than_the_train_set(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path / "out"), "--max_train_samples", "10"])
    assert result.returncode == 2
    assert "fewer than one batch" in result.stderr


# ---- flags the loop does not implement (in process: parsing and the check only) -------------


@pytest.fixture
def parse(monkeypatch: pytest.MonkeyPatch):
    """TrainingArguments from a config file plus flags, parsed here as one process.

    Parsing fills accelerate's process-wide state; it is reset afterwards, as in test_units.py.
    """
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    yield lambda *flags, config=SMOKE_CONFIG: parse_args([str(config), *flags])[2]
    AcceleratorState._reset_state(reset_partial_state=True)


CHECKPOINTING = "--activation_checkpointing (or --gradient_checkpointing)"
UNSUPPORTED = {
    "label_smoothing_factor": (["--label_smoothing_factor", "0.5"], "--label_smoothing_factor"),
    "report_to": (["--report_to", "wandb"], "--report_to wandb"),
    "eval_on_start": (["--eval_on_start", "true"], "--eval_on_start"),
    "eval_delay": (["--eval_delay", "2"], "--eval_delay"),
    "save_only_model": (["--save_only_model", "true"], "--save_only_model"),
    "push_to_hub": (["--push_to_hub", "true", "--hub_model_id", "me/model"], "--push_to_hub"),
    "torch_empty_cache_steps": (["--torch_empty_cache_steps", "4"], "--torch_empty_cache_steps"),
    "optim": (["--optim", "sgd"], "--optim sgd"),
    "batch_rebalance": (["--train_sampling_strategy", "batch_rebalance"], "--train_sampling_strategy batch_rebalance"),
    "lr_scheduler_needing_metrics": (["--lr_scheduler_type", "reduce_lr_on_plateau", "--eval_strategy", "epoch"],
                                     "--lr_scheduler_type reduce_lr_on_plateau"),
    "save_strategy_best": (["--save_strategy", "best", "--metric_for_best_model", "accuracy"], "--save_strategy best"),
    # Fields that TrainingArguments rewrites even when left alone (None -> False, "" -> [], a config object).
    "activation_checkpointing": (["--activation_checkpointing", "true"], CHECKPOINTING),
    "gradient_checkpointing": (["--gradient_checkpointing", "true"], CHECKPOINTING),  # its old name
    "debug": (["--debug", "underflow_overflow"], "--debug"),
    "accelerator_config": (["--accelerator_config", '{"split_batches": true}'], "--accelerator_config"),
    "remove_unused_columns": (["--remove_unused_columns", "true"], "--remove_unused_columns"),
    "torch_compile": (["--torch_compile_mode", "max-autotune"], "--torch_compile"),
}


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize(("flags", "named"), UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_refuses_a_training_argument_it_would_ignore(parse, flags: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match="is not supported by the native loop") as refusal:
        check_supported(parse(*flags))
    assert str(refusal.value).startswith(f"{named} is not supported by the native loop")
    assert "use the Trainer variant or " in str(refusal.value)


def test_label_smoothing_refusal_tells_what_to_do(parse) -> None:
    with pytest.raises(ConfigError) as refusal:
        check_supported(parse("--label_smoothing_factor", "0.5"))
    assert str(refusal.value) == ("--label_smoothing_factor is not supported by the native loop; "
                                  "use the Trainer variant or implement it in train.py")


@pytest.mark.parametrize("config", ["smoke.yaml", "default.yaml"])
def test_accepts_the_shipped_configs(parse, config: str) -> None:
    """Nothing a user leaves alone is refused, however TrainingArguments rewrites its defaults."""
    check_supported(parse("--mixed_precision", "no", config=REPO_ROOT / "configs" / config))


def test_accepts_the_flags_it_honours(parse) -> None:
    check_supported(parse("--report_to", "tensorboard", "--optim", "adamw_torch", "--eval_strategy", "steps",
                          "--eval_steps", "5", "--do_train", "--do_eval", "--dataloader_num_workers", "2",
                          "--lr_scheduler_type", "cosine", "--max_grad_norm", "0.5", "--ddp_timeout", "60",
                          "--train_sampling_strategy", "random", "--dataloader_drop_last", "true"))


def test_the_allow_list_names_real_training_arguments() -> None:
    """A misspelt or renamed field would leave its real namesake checked against its default: refused."""
    names = {field.name for field in dataclasses.fields(TrainingArguments)}
    assert sorted((HONOURED_FIELDS | REWRITTEN_FIELDS.keys()) - names) == []
    assert sorted(HONOURED_FIELDS & REWRITTEN_FIELDS.keys()) == []


# ---- the length-grouped sampler (no processes needed) ---------------------------------------


def shards(lengths: list[int], world_size: int, epoch: int, **options) -> list[list[int]]:
    result = []
    for rank in range(world_size):
        sampler = DistributedLengthGroupedSampler(lengths, 4, num_replicas=world_size, rank=rank, seed=1, **options)
        sampler.set_epoch(epoch)
        result.append(list(sampler))
    return result


LENGTHS = [(7 * i) % 61 + 3 for i in range(103)]  # 103: not divisible by 2 ranks x batch 4


def test_length_grouped_shards_are_even_disjoint_and_cover_everything() -> None:
    rank0, rank1 = shards(LENGTHS, 2, epoch=0)
    assert len(rank0) == len(rank1) == 52  # padded with one repeat so both ranks run 13 batches
    assert set(rank0) | set(rank1) == set(range(len(LENGTHS)))
    assert len(set(rank0) & set(rank1)) <= 1
    rank0, rank1 = shards(LENGTHS, 2, epoch=0, drop_last=True)
    assert len(rank0) == len(rank1) == 51 and set(rank0).isdisjoint(rank1)


def test_length_grouped_order_is_seeded_per_epoch_and_groups_lengths() -> None:
    assert shards(LENGTHS, 2, epoch=3) == shards(LENGTHS, 2, epoch=3)
    assert shards(LENGTHS, 2, epoch=3) != shards(LENGTHS, 2, epoch=4)
    rank0 = shards(LENGTHS, 2, epoch=0)[0]
    spread = [max(LENGTHS[i] for i in rank0[b:b + 4]) - min(LENGTHS[i] for i in rank0[b:b + 4])
              for b in range(0, len(rank0), 4)]
    assert sum(spread) / len(spread) < 0.25 * (max(LENGTHS) - min(LENGTHS))


def test_resumable_sampler_starts_the_epoch_after_the_examples_already_trained_on() -> None:
    sampler = ResumableSampler(DistributedLengthGroupedSampler(LENGTHS, 4, num_replicas=2, rank=1, seed=1))
    sampler.set_epoch(2)
    whole = list(sampler)
    sampler.set_epoch(2, start=12)
    assert list(sampler) == whole[12:] and len(sampler) == len(whole) - 12
