"""Prove the DDP is real: two torchrun processes on gloo train one model together.

The expensive runs happen once per module and every test reads their records
(tests/ddp_probe.py writes one JSON and one safetensors file per rank).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
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
    # The resumed run below rotates old checkpoints away; keep one for the explicit-resume test.
    kept = tmp_path_factory.mktemp("kept") / "checkpoint"
    shutil.copytree(output_dir / f"checkpoint-{(EPOCHS - 1) * STEPS_PER_EPOCH}", kept)
    return {"output_dir": output_dir, "records": read_probe(output_dir), "log": result.stdout + result.stderr,
            "kept_checkpoint": kept}


@pytest.fixture(scope="module")
def resumed_run(first_run: dict, smoke_assets: Path) -> dict:
    """The same output_dir, two more epochs: must pick up the newest checkpoint by itself."""
    output_dir = first_run["output_dir"]
    torchrun([PROBE, *smoke_flags(smoke_assets, output_dir), "--num_train_epochs", str(EPOCHS + 2)])
    return {"output_dir": output_dir, "records": read_probe(output_dir)}


def test_world_size_is_two(first_run: dict) -> None:
    assert [record["rank"] for record in first_run["records"]] == [0, 1]
    assert [record["world_size"] for record in first_run["records"]] == [2, 2]


def test_ranks_end_with_identical_weights(first_run: dict, smoke_assets: Path) -> None:
    probe = first_run["output_dir"] / "probe"
    rank0, rank1 = load_file(probe / "rank0.safetensors"), load_file(probe / "rank1.safetensors")
    assert rank0.keys() == rank1.keys()
    differing = [name for name in rank0 if not torch.equal(rank0[name], rank1[name])]
    assert differing == []
    initial = load_file(smoke_assets / "tiny-bert" / "model.safetensors")
    moved = [name for name in initial if name in rank0 and not torch.equal(initial[name], rank0[name])]
    assert len(moved) > len(initial) // 2, "training barely changed the weights"


def test_training_shards_are_disjoint_and_cover_the_train_set_every_epoch(first_run: dict) -> None:
    shards0, shards1 = (record["train_indices_per_epoch"] for record in first_run["records"])
    assert len(shards0) == len(shards1) == EPOCHS
    for shard0, shard1 in zip(map(set, shards0), map(set, shards1), strict=True):
        assert len(shard0) == len(shard1) == TRAIN_SIZE // 2
        assert shard0.isdisjoint(shard1)
        assert shard0 | shard1 == set(range(TRAIN_SIZE))


def test_loss_starts_at_chance_level_and_goes_down(first_run: dict) -> None:
    losses = first_run["records"][0]["logged_losses"]
    # Two balanced classes start at ln 2. A loss scaled by the world size would start near 2 ln 2.
    assert losses[0] == pytest.approx(math.log(2), abs=0.05)
    assert losses[-1] < 0.5 * losses[0]


def test_eval_accuracy_beats_chance(first_run: dict) -> None:
    metrics = json.loads((first_run["output_dir"] / "metrics.json").read_text())
    assert metrics["eval_accuracy"] > 0.8
    assert metrics["eval_f1_macro"] > 0.8


def test_eval_counts_every_example_exactly_once(first_run: dict, smoke_assets: Path) -> None:
    output_dir = first_run["output_dir"]
    metrics = json.loads((output_dir / "metrics.json").read_text())
    assert metrics["eval_num_examples"] == EVAL_SIZE

    # Recompute on one process from the saved model: same examples, so the same accuracy.
    rows = [json.loads(line) for line in (smoke_assets / "validation.jsonl").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    model = AutoModelForSequenceClassification.from_pretrained(output_dir).eval()
    with torch.no_grad():
        logits = model(**tokenizer([row["text"] for row in rows], padding=True, return_tensors="pt")).logits
    labels = [model.config.label2id[row["label"]] for row in rows]
    expected = classification_metrics(logits.argmax(-1).numpy(), torch.tensor(labels).numpy(), ["negative", "positive"])
    assert metrics["eval_accuracy"] == pytest.approx(expected["accuracy"], abs=1.01 / EVAL_SIZE)


def test_metrics_json_holds_final_eval_and_throughput(first_run: dict) -> None:
    metrics = json.loads((first_run["output_dir"] / "metrics.json").read_text())
    for key in ("eval_accuracy", "eval_f1_macro", "eval_loss", "train_samples_per_second", "train_runtime"):
        assert isinstance(metrics[key], float), key
    assert metrics["train_samples_per_second"] > 0


def test_metrics_json_holds_per_class_results_and_the_confusion_matrix(first_run: dict) -> None:
    metrics = json.loads((first_run["output_dir"] / "metrics.json").read_text())
    assert set(metrics["eval_per_class"]) == {"negative", "positive"}
    assert sum(row["support"] for row in metrics["eval_per_class"].values()) == EVAL_SIZE
    confusion = metrics["eval_confusion_matrix"]
    assert sum(map(sum, confusion)) == EVAL_SIZE
    assert (confusion[0][0] + confusion[1][1]) / EVAL_SIZE == pytest.approx(metrics["eval_accuracy"])


def test_training_curves_are_drawn_at_the_end(first_run: dict) -> None:
    assert (first_run["output_dir"] / "training_curves.png").read_bytes().startswith(b"\x89PNG")


def test_label_names_are_saved_in_the_model_config(first_run: dict) -> None:
    config = json.loads((first_run["output_dir"] / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}


def test_only_rank_zero_logs(first_run: dict) -> None:
    assert first_run["log"].count(" train examples, ") == 1
    assert first_run["log"].count("metrics written to") == 1


def test_checkpoints_are_written_per_epoch(first_run: dict) -> None:
    checkpoints = sorted(path.name for path in first_run["output_dir"].glob("checkpoint-*"))
    # save_total_limit 2 keeps the newest two of the epoch checkpoints.
    assert checkpoints == [f"checkpoint-{(EPOCHS - 1) * STEPS_PER_EPOCH}", f"checkpoint-{EPOCHS * STEPS_PER_EPOCH}"]
    newest = first_run["output_dir"] / f"checkpoint-{EPOCHS * STEPS_PER_EPOCH}"
    assert (newest / "model.safetensors").is_file()


@pytest.mark.slow
def test_second_run_resumes_from_the_newest_checkpoint(first_run: dict, resumed_run: dict) -> None:
    expected = str(first_run["output_dir"] / f"checkpoint-{EPOCHS * STEPS_PER_EPOCH}")
    assert [record["resumed_from"] for record in resumed_run["records"]] == [expected, expected]
    assert [record["steps_run"] for record in resumed_run["records"]] == [2 * STEPS_PER_EPOCH] * 2
    assert (first_run["output_dir"] / f"checkpoint-{(EPOCHS + 2) * STEPS_PER_EPOCH}").is_dir()


@pytest.mark.slow
def test_resume_from_an_explicit_checkpoint(first_run: dict, smoke_assets: Path, tmp_path: Path) -> None:
    checkpoint = first_run["kept_checkpoint"]
    flags = [*smoke_flags(smoke_assets, tmp_path), "--resume_from_checkpoint", str(checkpoint)]
    torchrun([PROBE, *flags])
    records = read_probe(tmp_path)
    assert [record["resumed_from"] for record in records] == [str(checkpoint)] * 2
    assert [record["steps_run"] for record in records] == [STEPS_PER_EPOCH] * 2


GRADIENT_CHECK_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from {package}.distributed import assert_gradients_synchronised

    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 2)
    if mode == "synced":
        model = torch.nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(dist.get_rank())  # each rank sees different data
    model(torch.randn(8, 4)).sum().backward()
    try:
        assert_gradients_synchronised(model)
        outcome = "in sync"
    except RuntimeError as err:
        outcome = "refused: " + str(err)
    (out_dir / ("rank%d.txt" % dist.get_rank())).write_text(outcome)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("mode, expected", [("synced", "in sync"), ("unsynced", "refused: gradients differ")])
def test_gradient_sync_check_refuses_ranks_that_do_not_share_gradients(
    tmp_path: Path, mode: str, expected: str
) -> None:
    script = tmp_path / "check.py"
    script.write_text(GRADIENT_CHECK_SCRIPT.replace("{package}", PACKAGE))
    # check=False: the outcome files are the result. With torch 2.13 a gloo process sometimes
    # aborts at interpreter exit ("terminate called without an active exception") after its work.
    torchrun([str(script), mode, str(tmp_path)], check=False)
    outcomes = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert all(outcome.startswith(expected) for outcome in outcomes), outcomes


def run_single_process(flags: list[str]) -> subprocess.CompletedProcess:
    """Plain `python -m <package>.train`, one process, no torchrun."""
    return run_python(["-m", f"{PACKAGE}.train", *flags])


@pytest.mark.slow
def test_do_eval_false_trains_without_evaluating(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path), "--max_steps", "2", "--do_eval", "false"])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert "train_loss" in metrics and not [key for key in metrics if key.startswith("eval_")]


@pytest.mark.slow
def test_do_train_false_only_evaluates_the_loaded_model(first_run: dict, smoke_assets: Path, tmp_path: Path) -> None:
    flags = smoke_flags(smoke_assets, tmp_path)
    flags[flags.index("--model_name_or_path") + 1] = str(first_run["output_dir"])  # the trained model
    result = run_single_process([*flags, "--do_train", "false"])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    trained = json.loads((first_run["output_dir"] / "metrics.json").read_text())
    assert "train_loss" not in metrics and metrics["eval_num_examples"] == EVAL_SIZE
    assert metrics["eval_accuracy"] == trained["eval_accuracy"]
    assert not list(tmp_path.glob("checkpoint-*")), "it trained anyway"


@pytest.mark.slow
def test_nothing_to_do_is_refused(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path), "--do_train", "false", "--do_eval", "false"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --do_train false and --do_eval false leave nothing to do; keep at least one")


@pytest.mark.slow
def test_a_mistyped_resume_path_is_named_as_missing(smoke_assets: Path, tmp_path: Path) -> None:
    missing = tmp_path / "checkpoint-7"
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path / "out"),
                                 "--resume_from_checkpoint", str(missing)])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: --resume_from_checkpoint '{missing}' does not exist"


AGREE_SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    from pathlib import Path

    import torch.distributed as dist
    from {package}.config import ConfigError
    from {package}.distributed import agree_on_precision
    from {package}.resume import agree_on_resume_checkpoint

    what, out_dir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    try:
        if what == "precision":  # rank 1 stands for a GPU without native bf16, next to one with it
            agree_on_precision("bf16" if rank == 0 else "fp16")
        else:  # rank 1 stands for a node that cannot see the checkpoint (output_dir not shared)
            agree_on_resume_checkpoint(what, str(out_dir), "any", lambda path: None if rank == 0 else "does not exist")
        outcome = "went on"
    except ConfigError as err:
        outcome = "error: " + str(err)
    (out_dir / ("rank%d.txt" % dist.get_rank())).write_text(outcome)
    dist.destroy_process_group()
    """
)


def agree(tmp_path: Path, what: str) -> list[str]:
    """Each rank's outcome of the agreement script; fast, though the group's timeout is 600 s."""
    script = tmp_path / "agree.py"
    script.write_text(AGREE_SCRIPT.replace("{package}", PACKAGE))
    started = time.monotonic()
    torchrun([str(script), what, str(tmp_path)], timeout=120)
    assert time.monotonic() - started < 60
    return [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]


@pytest.mark.slow
def test_a_checkpoint_one_rank_cannot_read_fails_every_rank_at_once(tmp_path: Path) -> None:
    """Not only the rank that cannot read it: the others would wait in their next collective until timeout."""
    expected = (f"error: checkpoint '{tmp_path / 'checkpoint-4'}' is on rank 0 but rank(s) 1 cannot read it "
                "(does not exist): with several nodes, --output_dir must be on a filesystem every node shares")
    assert agree(tmp_path, str(tmp_path / "checkpoint-4")) == [expected, expected]


@pytest.mark.slow
def test_ranks_that_chose_different_precisions_refuse_together(tmp_path: Path) -> None:
    expected = ("error: the ranks chose different precisions (rank 0: bf16, rank 1: fp16), as on a cluster mixing "
                "GPU types; pass --mixed_precision fp16 (or no) so that every rank trains alike")
    assert agree(tmp_path, "precision") == [expected, expected]


@pytest.mark.slow
@pytest.mark.skipif(IS_NATIVE, reason="the native loop resumes on another world size (test_native_loop.py)")
def test_the_trainer_refuses_to_resume_a_checkpoint_of_another_world_size(first_run: dict, smoke_assets: Path,
                                                                          tmp_path: Path) -> None:
    """Upstream it would count the batches to skip in its own, smaller global batches: other examples."""
    checkpoint = first_run["kept_checkpoint"]
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path), "--resume_from_checkpoint", str(checkpoint)])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: checkpoint '{checkpoint}' was written by a run with a global batch of 32 (2 processes x "
        "--per_device_train_batch_size 16 x --gradient_accumulation_steps 1), but this run has a global batch of 16 "
        "(1 process x --per_device_train_batch_size 16 x --gradient_accumulation_steps 1). The Trainer resumes only "
        "the same split (the native loop can resume on another world size): run with the checkpoint's settings, or "
        "use a new --output_dir")


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
