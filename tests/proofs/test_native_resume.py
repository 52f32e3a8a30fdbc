"""What only the native loop has to prove: exact resume, also on another world size, gradient
accumulation, atomic checkpoints, exact evaluation, and refusing to resume what it cannot continue.

The torchrun runs (2 CPU processes, gloo) happen once per module; every test reads their records
(tests/ddp_probe.py writes one JSON and one safetensors file per rank). A native render only.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import EVAL_SIZE, PACKAGE, REPO_ROOT, TRAIN_SIZE, package_module, read_probe, smoke_flags
from no_dropout import copy_without_dropout
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from warm_launch import run_python, torchrun

pytestmark = pytest.mark.slow  # real launches

batching = package_module("batching")
classification_metrics = package_module("metrics").classification_metrics
config = package_module("config")
train = package_module("train")
TRAINING_STATE, SHARDED_STATE = package_module("checkpoint").TRAINING_STATE, package_module("checkpoint").SHARDED_STATE

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


def assert_weights_close(expected: dict, actual: dict, atol: float) -> None:
    assert expected.keys() == actual.keys()
    worst = max((expected[name] - actual[name]).abs().max().item() for name in expected)
    assert worst <= atol, f"largest weight difference {worst:.3g} > {atol}"


def run_single_process(args: list[str], script: str | None = None) -> subprocess.CompletedProcess:
    """Plain `python` without torchrun: the loop must run alone, as one process."""
    return run_python([script, *args] if script else ["-m", f"{PACKAGE}.train", *args])


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
        "config.json", SHARDED_STATE, "tokenizer.json", "tokenizer_config.json", "batch_plan.json", TRAINING_STATE}
    # Weights and AdamW's state through torch.distributed.checkpoint: DDP's ranks hold the same tensors,
    # written once, spread over both ranks' files.
    assert {path.name for path in (checkpoint / SHARDED_STATE).iterdir()} == {".metadata", "__0_0.distcp",
                                                                              "__1_0.distcp"}
    saved = dcp.FileSystemReader(checkpoint / SHARDED_STATE).read_metadata().state_dict_metadata
    weights = load_file(uninterrupted / "model.safetensors")
    assert {name.removeprefix("model.") for name in saved if name.startswith("model.")} == weights.keys()
    assert {f"optimizer.state.{name}.exp_avg" for name in weights} <= saved.keys()
    state = torch.load(checkpoint / TRAINING_STATE, map_location="cpu", weights_only=True)
    assert (state["global_step"], state["epoch"], state["step_in_epoch"]) == (
        INTERRUPTED_AT, INTERRUPTED_AT // STEPS_PER_EPOCH, INTERRUPTED_AT % STEPS_PER_EPOCH
    )
    assert json.loads((checkpoint / "batch_plan.json").read_text()) == {
        "global_batch_size": 32, "per_device_train_batch_size": 16, "world_size": 2, "gradient_accumulation_steps": 1,
        "train_size": TRAIN_SIZE, "steps_per_epoch": STEPS_PER_EPOCH}
    assert "batch_plan" not in state, "the plan is kept once, in batch_plan.json"
    assert state["labels"] == ["negative", "positive"]
    assert {"scheduler", "scaler"} <= state.keys() and "optimizer" not in state
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
    expected = classification_metrics(output.logits.argmax(-1).numpy(), labels.numpy(), ["negative", "positive"])
    assert metrics["eval_num_examples"] == EVAL_SIZE
    assert metrics["eval_accuracy"] == expected["accuracy"]
    assert metrics["eval_f1_macro"] == pytest.approx(expected["f1_macro"], abs=1e-12)
    assert metrics["eval_loss"] == pytest.approx(output.loss.item(), abs=1e-5)


# ---- gradient accumulation ------------------------------------------------------------------


@pytest.fixture(scope="module")
def no_dropout_assets(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke model without dropout, so two runs differ only in how they batch."""
    return copy_without_dropout(smoke_assets, tmp_path_factory.mktemp("no_dropout"))


# Sequential sampling: with 2 ranks, micro-batch k of rank r holds examples 2i + r, so one optimizer
# step of 2 ranks x 8 x 2 micro-batches covers examples 0-31, exactly the 1 rank x 32 batch. 180
# examples: the sixth and last step holds 20, micro-batches of 8 and 2 per rank, which equal the batch
# of 20 only if each micro-batch weighs by its examples. Adam barely notices a gradient scaled by a
# constant, so the logged loss and gradient norm (taken before clipping) are what catch a loss not
# divided by the accumulation steps or summed over ranks.
ACCUMULATION_FLAGS = ["--train_sampling_strategy", "sequential", "--max_train_samples", "180", "--num_train_epochs",
                      "1", "--logging_steps", "1", "--save_strategy", "no"]


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


def test_a_run_resumed_from_an_earlier_checkpoint_replaces_the_checkpoints_it_reaches_again(
        smoke_assets: Path, tmp_path: Path) -> None:
    """Branched from checkpoint-1 (clipping its gradients hard), the run saves step 2 again: its own weights
    must replace the first run's, or checkpoint-2, and a resume from it, would hold the other branch."""
    output_dir = tmp_path / "out"
    flags = [*smoke_flags(smoke_assets, output_dir), "--max_steps", "2", "--save_strategy", "steps",
             "--save_steps", "1", "--do_eval", "false"]
    assert run_single_process(flags).returncode == 0
    first = load_file(output_dir / "model.safetensors")
    branch = run_single_process([*flags, "--max_grad_norm", "1e-4",
                                 "--resume_from_checkpoint", str(output_dir / "checkpoint-1")])
    assert branch.returncode == 0, branch.stderr[-3000:]
    dcp_to_torch_save(output_dir / "checkpoint-2" / SHARDED_STATE, tmp_path / "checkpoint-2.pt")
    saved = torch.load(tmp_path / "checkpoint-2.pt", weights_only=False)["model"]
    branched = load_file(output_dir / "model.safetensors")  # the branch's final model: its step 2
    assert_weights_close(branched, saved, atol=0.0)
    assert not torch.equal(first["classifier.weight"], branched["classifier.weight"])
    assert sorted(path.name for path in output_dir.iterdir() if "checkpoint" in path.name) == [
        "checkpoint-1", "checkpoint-2"]


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


def test_refuses_to_resume_under_another_global_batch(uninterrupted: Path, smoke_assets: Path, tmp_path: Path) -> None:
    """A checkpoint's place in its epoch counts its own steps: step 4 of 8 (2 ranks x 16) is half of a
    2 x 8 epoch's, so the resumed run would train on other examples than the ones it skipped."""
    output_dir = tmp_path / "out"
    checkpoint = output_dir / f"checkpoint-{INTERRUPTED_AT}"
    shutil.copytree(uninterrupted / checkpoint.name, checkpoint)
    result = torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(smoke_assets, output_dir),
                       "--per_device_train_batch_size", "8", "--max_steps", str(TOTAL_STEPS)], check=False)
    assert result.returncode != 0, result.stdout[-3000:]
    saved = "a global batch of 32 (2 processes x --per_device_train_batch_size 16 x --gradient_accumulation_steps 1)"
    this = "a global batch of 16 (2 processes x --per_device_train_batch_size 8 x --gradient_accumulation_steps 1)"
    assert f"checkpoint {str(checkpoint)!r} was written by a run with {saved}" in result.stderr
    assert f"but this run has {this}" in result.stderr
    assert [path.name for path in output_dir.iterdir()] == [checkpoint.name], "it trained anyway"


def test_refuses_another_world_size_that_cannot_make_the_global_batch(uninterrupted: Path, smoke_assets: Path,
                                                                     tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    shutil.copytree(uninterrupted / f"checkpoint-{INTERRUPTED_AT}", output_dir / f"checkpoint-{INTERRUPTED_AT}")
    result = run_single_process([*smoke_flags(smoke_assets, output_dir), "--per_device_train_batch_size", "12"])
    assert result.returncode == 2, result.stdout[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the checkpoint's global batch of 32 (2 processes x 16 x 1 accumulation steps) cannot be made from "
        "--per_device_train_batch_size 12 on 1 processes; pick a batch size that, times 1, divides 32")


# A job stopped on 2 processes resumes on 1: 2 x batch 8 becomes 1 x batch 8 x 2 accumulation steps.
RESHAPED_FLAGS = ["--per_device_train_batch_size", "8", "--num_train_epochs", "2", "--save_strategy", "steps",
                  "--save_steps", "4", "--save_total_limit", "10"]
RESHAPED_AT = 20  # of 2 x 256 / 16 = 32 steps: a quarter into the second epoch
RESHAPED_RTOL = 1e-5


def test_a_run_stopped_on_two_processes_resumes_on_one_to_the_same_weights(no_dropout_assets: Path,
                                                                         tmp_path: Path) -> None:
    uninterrupted, resumed = tmp_path / "two_processes", tmp_path / "resumed_on_one"
    torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(no_dropout_assets, uninterrupted), *RESHAPED_FLAGS])
    shutil.copytree(uninterrupted / f"checkpoint-{RESHAPED_AT}", resumed / f"checkpoint-{RESHAPED_AT}")
    result = run_single_process([*smoke_flags(no_dropout_assets, resumed), *RESHAPED_FLAGS])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming a run of 2 processes on 1: 2 accumulation steps keep its global batch of 16" in result.stdout
    expected, actual = (load_file(folder / "model.safetensors") for folder in (uninterrupted, resumed))
    worst = max(((expected[name] - actual[name]).abs().max() / expected[name].abs().max()).item() for name in expected)
    assert worst <= RESHAPED_RTOL, f"largest relative weight difference {worst:.3g}"


def test_refuses_a_folder_that_is_not_a_checkpoint_of_this_loop(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path / "out"),
                                 "--resume_from_checkpoint", str(smoke_assets / "tiny-bert")])
    assert result.returncode == 2
    assert f"--resume_from_checkpoint '{smoke_assets / 'tiny-bert'}' holds no {TRAINING_STATE}" in result.stderr


def test_refuses_a_batch_larger_than_the_train_set(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path / "out"), "--max_train_samples", "10"])
    assert result.returncode == 2
    assert result.stderr == (
        "error: one optimizer step takes 16 examples (1 process(es) x --per_device_train_batch_size 16 x "
        "--gradient_accumulation_steps 1), more than the 10 train examples: lower them, start fewer processes "
        "or add data\n")
