"""Prove the DDP is real: two torchrun processes on gloo train one model together. The expensive runs happen
once per module and every test reads their records (tests/ddp_probe.py writes one JSON and one safetensors
file per rank)."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from conftest import (
    EVAL_SIZE,
    IS_NATIVE,
    PACKAGE,
    REPO_ROOT,
    SMOKE,
    TRAIN_SIZE,
    package_module,
    read_probe,
    run_python,
    smoke_flags,
    torchrun,
)
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

classification_metrics = package_module("metrics").classification_metrics

PROBE = str(REPO_ROOT / "tests" / "ddp_probe.py")
STEPS_PER_EPOCH = TRAIN_SIZE // (2 * SMOKE["per_device_train_batch_size"])  # 2 ranks
EPOCHS = SMOKE["num_train_epochs"]


@pytest.fixture(scope="module")
def first_run(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    output_dir = tmp_path_factory.mktemp("ddp_run")
    result = torchrun([PROBE, *smoke_flags(smoke_assets, output_dir), "--logging_first_step", "true"])
    return {"output_dir": output_dir, "records": read_probe(output_dir), "log": result.stdout + result.stderr}


@pytest.fixture(scope="module")
def resumed_run(first_run: dict, smoke_assets: Path) -> dict:
    output_dir = first_run["output_dir"]
    torchrun([PROBE, *smoke_flags(smoke_assets, output_dir), "--num_train_epochs", str(EPOCHS + 2)])
    return {"output_dir": output_dir, "records": read_probe(output_dir)}


def test_two_ranks_end_with_identical_weights_rank_zero_alone_logs_no_buffers_are_synced(
    first_run: dict, smoke_assets: Path
) -> None:
    assert [record["rank"] for record in first_run["records"]] == [0, 1]
    assert [record["world_size"] for record in first_run["records"]] == [2, 2]
    assert first_run["log"].count(" train examples, ") == 1
    assert first_run["log"].count("metrics written to") == 1
    assert [record["ddp_broadcast_buffers"] for record in first_run["records"]] == [0, 0]  # a collective a step
    assert [record["ddp_gradient_as_bucket_view"] for record in first_run["records"]] == [1, 1]
    assert "broadcast_buffers" not in first_run["log"]  # no FutureWarning per rank about the flag's name
    probe = first_run["output_dir"] / "probe"
    rank0, rank1 = load_file(probe / "rank0.safetensors"), load_file(probe / "rank1.safetensors")
    assert rank0.keys() == rank1.keys()
    differing = [name for name in rank0 if not torch.equal(rank0[name], rank1[name])]
    assert differing == []
    initial = load_file(smoke_assets / "tiny-bert" / "model.safetensors")
    moved = [name for name in initial if name in rank0 and not torch.equal(initial[name], rank0[name])]
    assert len(moved) > len(initial) // 2, "training barely changed the weights"


def test_loss_falls_from_chance_on_disjoint_shards_covering_each_epoch(first_run: dict) -> None:
    losses = first_run["records"][0]["logged_losses"]
    # Two balanced classes start at ln 2. A loss scaled by the world size would start near 2 ln 2.
    assert losses[0] == pytest.approx(math.log(2), abs=0.05)
    assert losses[-1] < 0.5 * losses[0]
    shards0, shards1 = (record["train_indices_per_epoch"] for record in first_run["records"])
    assert len(shards0) == len(shards1) == EPOCHS
    for shard0, shard1 in zip(map(set, shards0), map(set, shards1), strict=True):
        assert len(shard0) == len(shard1) == TRAIN_SIZE // 2
        assert shard0.isdisjoint(shard1)
        assert shard0 | shard1 == set(range(TRAIN_SIZE))


def test_eval_counts_every_example_exactly_once(first_run: dict, smoke_assets: Path) -> None:
    output_dir = first_run["output_dir"]
    metrics = json.loads((output_dir / "metrics.json").read_text())
    assert metrics["eval_num_examples"] == EVAL_SIZE

    # Recompute on one process from the saved model: same examples, so the same accuracy and loss (2 ranks
    # split 101 rows unevenly: a loss averaged over batches, repeats included, would differ).
    rows = [json.loads(line) for line in (smoke_assets / "validation.jsonl").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    model = AutoModelForSequenceClassification.from_pretrained(output_dir).eval()
    labels = torch.tensor([model.config.label2id[row["label"]] for row in rows])
    with torch.no_grad():
        output = model(**tokenizer([row["text"] for row in rows], padding=True, return_tensors="pt"), labels=labels)
    expected = classification_metrics(output.logits.argmax(-1).numpy(), labels.numpy(), ["negative", "positive"])
    assert metrics["eval_accuracy"] == pytest.approx(expected["accuracy"], abs=1.01 / EVAL_SIZE)
    assert metrics["eval_loss"] == pytest.approx(output.loss.item(), abs=1e-5)


def test_metrics_json_holds_eval_above_chance_per_class_and_throughput(first_run: dict) -> None:
    metrics = json.loads((first_run["output_dir"] / "metrics.json").read_text())
    assert metrics["eval_accuracy"] > 0.8
    assert metrics["eval_f1_macro"] > 0.8
    for key in ("eval_accuracy", "eval_f1_macro", "eval_loss", "train_samples_per_second", "train_runtime"):
        assert isinstance(metrics[key], float), key
    assert metrics["train_samples_per_second"] > 0
    assert metrics["versions"]["torch"] == torch.__version__
    assert metrics["versions"]["transformers"] == transformers.__version__
    assert set(metrics["eval_per_class"]) == {"negative", "positive"}
    assert sum(row["support"] for row in metrics["eval_per_class"].values()) == EVAL_SIZE
    confusion = metrics["eval_confusion_matrix"]
    assert sum(map(sum, confusion)) == EVAL_SIZE
    assert (confusion[0][0] + confusion[1][1]) / EVAL_SIZE == pytest.approx(metrics["eval_accuracy"])


def test_output_dir_holds_curves_label_names_and_epoch_checkpoints(first_run: dict) -> None:
    assert (first_run["output_dir"] / "training_curves.png").read_bytes().startswith(b"\x89PNG")
    config = json.loads((first_run["output_dir"] / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    checkpoints = sorted(path.name for path in first_run["output_dir"].glob("checkpoint-*"))
    # save_total_limit 2 keeps the newest two of the epoch checkpoints.
    assert checkpoints == [f"checkpoint-{(EPOCHS - 1) * STEPS_PER_EPOCH}", f"checkpoint-{EPOCHS * STEPS_PER_EPOCH}"]
    newest = first_run["output_dir"] / f"checkpoint-{EPOCHS * STEPS_PER_EPOCH}"
    # The native loop writes weights and optimizer through torch.distributed.checkpoint (checkpoint.py).
    assert (newest / ("model_and_optimizer" if IS_NATIVE else "model.safetensors")).exists()


@pytest.mark.slow
def test_second_run_resumes_from_the_newest_checkpoint(first_run: dict, resumed_run: dict) -> None:
    expected = str(first_run["output_dir"] / f"checkpoint-{EPOCHS * STEPS_PER_EPOCH}")
    assert [record["resumed_from"] for record in resumed_run["records"]] == [expected, expected]
    assert [record["steps_run"] for record in resumed_run["records"]] == [2 * STEPS_PER_EPOCH] * 2
    assert (first_run["output_dir"] / f"checkpoint-{(EPOCHS + 2) * STEPS_PER_EPOCH}").is_dir()


def test_the_newest_complete_checkpoint_is_chosen_and_a_save_cut_short_is_not(tmp_path: Path) -> None:
    resume, last_file = package_module("resume"), package_module("training_args").CHECKPOINT_LAST_FILE
    for step, complete in ((9, True), (10, True), (12, False)):  # checkpoint-12: killed while saving
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / ("config.json" if not complete else last_file)).write_text("{}")
    (tmp_path / "tmp-checkpoint-13").mkdir()
    (tmp_path / "tmp-checkpoint-13" / last_file).write_text("{}")
    complete = resume.complete_checkpoints(tmp_path, last_file)
    assert complete == [tmp_path / "checkpoint-9", tmp_path / "checkpoint-10"]
    assert resume.agree_on_resume_checkpoint(None, str(tmp_path), last_file) == tmp_path / "checkpoint-10"
    assert resume.agree_on_resume_checkpoint(None, str(tmp_path / "none"), last_file) is None
    cut_short = f"^--resume_from_checkpoint '.*checkpoint-12' holds no {last_file}: "
    with pytest.raises(package_module("config").ConfigError, match=cut_short):
        resume.agree_on_resume_checkpoint(str(tmp_path / "checkpoint-12"), str(tmp_path), last_file)
    if not IS_NATIVE:
        from transformers.trainer import TRAINER_STATE_NAME

        assert last_file == TRAINER_STATE_NAME  # what the Trainer writes last


def test_length_sorted_shards_cover_every_row_once_and_gather_back_in_row_order() -> None:
    distributed = package_module("distributed")
    lengths = [5, 9, 1, 9, 3, 7, 2]
    shards = [distributed.length_sorted_shard(lengths, rank, 3) for rank in range(3)]
    assert sorted(int(i) for shard in shards for i in shard) == list(range(len(lengths)))
    assert [lengths[i] for i in shards[0]] == [9, 5, 1]  # of 9, 9, 7, 5, 3, 2, 1: every third, longest first
    rows = shards[1]
    values = np.asarray([[float(i), -float(i)] for i in rows])
    (whole,) = distributed.gather_shards(rows, len(lengths), values)  # one process: its own rows only
    assert whole[rows].tolist() == values.tolist()


def test_a_sigterm_asks_the_run_to_stop_while_it_trains_and_ends_it_at_once_after() -> None:
    """Past its last step a worker has nothing to save: torchrun's SIGTERM (a node joining as the run ends)
    must not wait the 30 s it gives a worker before SIGKILL."""
    script = ("import os, signal, time\n"
              f"from {PACKAGE}.distributed import cleanup_distributed\n"
              f"from {PACKAGE}.stopping import StopRequest\n"
              "request = StopRequest()\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              "print('asked to stop:', request.agreed(), flush=True)\n"
              "cleanup_distributed()\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              "time.sleep(60)\n"
              "print('still running', flush=True)\n")
    result = run_python(["-c", script], timeout=30)
    assert result.returncode == -signal.SIGTERM, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["asked to stop: True"]
