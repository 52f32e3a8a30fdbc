"""Sentence pairs, regression and multi-label, trained for real (torchrun, 2 gloo processes), and
predictions on new data: in input order, the same on 2 processes as on 1, matching the eval figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import EVAL_SIZE, PACKAGE, REPO_ROOT, package_module, read_jsonl
from warm_launch import run_python, torchrun

pytestmark = pytest.mark.slow  # real launches: `make test-all`

CONFIGS = REPO_ROOT / "configs"


def task_flags(task: str, assets: Path, output_dir: Path) -> list[str]:
    """configs/smoke_<task>.yaml, pointed at the test's own assets and output folder."""
    return [
        str(CONFIGS / f"smoke_{task}.yaml"),
        "--model_name_or_path", str(assets / "tiny-bert"),
        "--train_file", str(assets / task / "train.jsonl"),
        "--validation_file", str(assets / task / "validation.jsonl"),
        "--output_dir", str(output_dir),
        "--disable_tqdm", "true",
    ]


@pytest.fixture(scope="module")
def task_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke assets at their default size (512 train examples per task, as `make smoke` writes them)."""
    return package_module("smoke").make_smoke_assets(tmp_path_factory.mktemp("task_assets"), eval_size=EVAL_SIZE)


@pytest.fixture(scope="module")
def trained(task_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each task trained on 2 processes; the pair task also predicts its eval file at the end (--do_predict)."""
    runs = {}
    for task in ("pairs", "regression", "multilabel"):
        output_dir = tmp_path_factory.mktemp(task)
        flags = [*task_flags(task, task_assets, output_dir), "--save_strategy", "no"]  # learning, not saving
        if task == "pairs":
            flags += ["--do_predict", "true", "--test_file", str(task_assets / task / "validation.jsonl")]
        result = torchrun(["-m", f"{PACKAGE}.train", *flags], timeout=600)
        runs[task] = {"output_dir": output_dir, "stdout": result.stdout,
                      "metrics": json.loads((output_dir / "metrics.json").read_text())}
    return runs


def test_the_configs_name_their_task() -> None:
    pairs, regression, multilabel = (yaml.safe_load((CONFIGS / f"smoke_{task}.yaml").read_text())
                                     for task in ("pairs", "regression", "multilabel"))
    assert (pairs["text_column"], pairs["text_pair_column"]) == ("sentence1", "sentence2")
    assert regression["problem_type"] == "regression"
    assert multilabel["problem_type"] == "multi_label_classification"


def test_a_pair_task_that_needs_both_texts_is_learned(trained: dict) -> None:
    run = trained["pairs"]
    assert "world size 2" in run["stdout"]
    # The label says whether the two texts carry the same sentiment: either text alone gives chance.
    assert run["metrics"]["eval_accuracy"] > 0.8, run["metrics"]
    assert run["metrics"]["eval_num_examples"] == EVAL_SIZE
    config = json.loads((run["output_dir"] / "config.json").read_text())
    assert config["classification_inputs"]["text_pair_column"] == "sentence2"


def test_regression_is_learned(trained: dict) -> None:
    metrics = trained["regression"]["metrics"]
    assert metrics["eval_pearson"] > 0.8, metrics
    assert metrics["eval_spearman"] > 0.7 and metrics["eval_num_examples"] == EVAL_SIZE
    config = json.loads((trained["regression"]["output_dir"] / "config.json").read_text())
    assert (config["problem_type"], len(config["id2label"])) == ("regression", 1)


def test_multi_label_is_learned(trained: dict) -> None:
    metrics = trained["multilabel"]["metrics"]
    assert metrics["eval_f1_micro"] > 0.8, metrics
    assert set(metrics["eval_per_class"]) == {"food", "music", "sports", "travel"}
    assert "multi_label_classification" in trained["multilabel"]["stdout"]  # what auto would pick, logged


def test_do_predict_writes_every_eval_row_in_order_with_the_eval_accuracy(trained: dict, task_assets: Path) -> None:
    run = trained["pairs"]
    rows = read_jsonl(task_assets / "pairs" / "validation.jsonl")
    predicted = read_jsonl(run["output_dir"] / "predictions.jsonl")
    assert [{key: row[key] for key in ("sentence1", "sentence2", "label")} for row in predicted] == rows
    accuracy = sum(row["prediction"] == row["label"] for row in predicted) / len(rows)
    assert accuracy == run["metrics"]["eval_accuracy"]
    assert all(0.5 <= row["score"] <= 1.0 for row in predicted)


@pytest.mark.parametrize("task", ["pairs", "regression", "multilabel"])
def test_predict_on_two_processes_writes_each_row_once_and_agrees_with_one(
    trained: dict, task_assets: Path, tmp_path: Path, task: str
) -> None:
    model, rows = trained[task]["output_dir"], task_assets / task / "validation.jsonl"
    flags = ["--model_name_or_path", str(model), "--input_file", str(rows)]
    torchrun(["-m", f"{PACKAGE}.predict", *flags, "--output_file", str(tmp_path / "two.jsonl"), "--batch_size", "8"])
    one = run_python(["-m", f"{PACKAGE}.predict", *flags, "--output_file", str(tmp_path / "one.jsonl")])
    assert one.returncode == 0, one.stderr[-3000:]
    two, one = read_jsonl(tmp_path / "two.jsonl"), read_jsonl(tmp_path / "one.jsonl")
    inputs = read_jsonl(rows)
    assert len(two) == len(one) == len(inputs) == EVAL_SIZE
    assert [{key: row[key] for key in inputs[0]} for row in two] == inputs  # each row once, in input order
    if task == "regression":  # other batches, other padding: the same values to float rounding
        expected = pytest.approx([row["prediction"] for row in one], rel=1e-5, abs=1e-5)
        assert [row["prediction"] for row in two] == expected
    else:
        assert [row["prediction"] for row in two] == [row["prediction"] for row in one]
    if task == "regression":
        predictions = [row["prediction"] for row in one]
        metrics = trained[task]["metrics"]
        mse = sum((p - row["label"]) ** 2 for p, row in zip(predictions, inputs, strict=True)) / len(inputs)
        assert mse == pytest.approx(metrics["eval_mse"], rel=1e-4)
    if task == "multilabel":
        assert all(set(row["prediction"]) <= {"food", "music", "sports", "travel"} for row in one)
