"""metrics.py: classification figures, metrics.json, training curves and whole-run totals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import names_from, package_module

classification_metrics, write_metrics = names_from("metrics", "classification_metrics", "write_metrics")

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


def test_metrics_match_by_hand_flatten_their_inputs_and_handle_no_examples() -> None:
    labels = np.array([0, 0, 1, 1, 2, 2])
    predictions = np.array([0, 1, 1, 1, 0, 0])  # class 2 never predicted; class 3 absent from both
    metrics = classification_metrics(predictions, labels, ["a", "b", "c", "d"])
    # accuracy 3/6. F1 = 2 TP / (predicted + actual): class 0 2/5, class 1 4/5, class 2 0/2;
    # class 3 appears nowhere and does not count, so macro-F1 = (0.4 + 0.8 + 0) / 3.
    assert metrics["accuracy"] == pytest.approx(0.5)
    assert metrics["f1_macro"] == pytest.approx(0.4)
    assert metrics["num_examples"] == 6
    # Rows are true labels, columns predictions.
    assert metrics["confusion_matrix"] == [[1, 1, 0, 0], [0, 2, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]]
    assert metrics["per_class"]["a"] == {"precision": pytest.approx(1 / 3), "recall": 0.5, "f1": pytest.approx(0.4),
                                         "support": 2}
    assert metrics["per_class"]["b"] == {"precision": pytest.approx(2 / 3), "recall": 1.0, "f1": pytest.approx(0.8),
                                         "support": 2}
    assert metrics["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert json.loads(json.dumps(metrics)) == metrics  # plain types: metrics.json takes them as they are
    names = ["no", "yes"]
    assert classification_metrics(np.array([[1], [0]]), np.array([[1], [1]]), names)["accuracy"] == pytest.approx(0.5)
    empty = classification_metrics(np.array([], dtype=int), np.array([], dtype=int), names)
    assert (empty["accuracy"], empty["f1_macro"], empty["num_examples"]) == (0.0, 0.0, 0)
    assert empty["confusion_matrix"] == [[0, 0], [0, 0]]


def test_training_curves_plot_loss_learning_rate_and_eval_metrics_logged_more_than_once(tmp_path: Path) -> None:
    history = [{"step": 1, "loss": 0.7, "learning_rate": 1e-3, "grad_norm": 1.0},
               {"step": 1, "eval_accuracy": 0.6, "eval_loss": 0.6, "eval_runtime": 1.0},
               {"step": 2, "loss": 0.5, "learning_rate": 5e-4},
               {"step": 2, "eval_accuracy": 0.8, "eval_loss": 0.4, "eval_runtime": 1.0, "eval_per_class": {}},
               {"step": 2, "eval_f1_macro": 0.7}]  # the Trainer's final evaluation adds one such line
    path = tmp_path / "training_curves.png"
    series = package_module("metrics").plot_training_curves(history, path)
    assert series == ["eval_accuracy", "eval_loss", "learning_rate", "loss"]
    assert path.read_bytes().startswith(b"\x89PNG")
    assert package_module("metrics").plot_training_curves(history[:2], tmp_path / "one_step.png") == []
    assert not (tmp_path / "one_step.png").exists()


def test_write_metrics_sorts_and_an_evaluation_alone_keeps_train_figures(tmp_path: Path) -> None:
    path = write_metrics(str(tmp_path / "new" / "dir"), dict(f1_macro=0.4, accuracy=0.5, num_examples=6), trained=True)
    assert path == tmp_path / "new" / "dir" / "metrics.json"
    text = path.read_text()
    assert text.endswith("\n")
    assert list(json.loads(text)) == ["accuracy", "f1_macro", "num_examples", "versions"]
    assert json.loads(text)["num_examples"] == 6
    assert json.loads(text)["versions"] == package_module("metrics").library_versions()
    first = {"train_loss": 0.3, "epoch": 2.0, "eval_accuracy": 0.9, "eval_loss": 0.2}
    write_metrics(str(tmp_path), first, trained=True)
    write_metrics(str(tmp_path), {"eval_accuracy": 0.95, "eval_num_examples": 50, "epoch": 0.0}, trained=False)
    versions = package_module("metrics").library_versions()
    assert json.loads((tmp_path / "metrics.json").read_text()) == {
        "train_loss": 0.3, "epoch": 2.0, "eval_accuracy": 0.95, "eval_num_examples": 50, "versions": versions}
    write_metrics(str(tmp_path), {"train_loss": 0.1}, trained=True)  # a new training run writes it whole
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"train_loss": 0.1, "versions": versions}


def test_a_run_is_finished_with_no_step_left_and_its_metrics_written_which_weigh_losses_by_steps(
    tmp_path: Path,
) -> None:
    is_finished = package_module("metrics").is_finished
    assert not is_finished(str(tmp_path), 0)  # trained to the end, but metrics.json was never written
    (tmp_path / "metrics.json").write_text("{}\n")
    assert is_finished(str(tmp_path), 0)
    assert not is_finished(str(tmp_path), 3)  # e.g. run again with more epochs
    metrics = package_module("metrics")
    history = [{"step": 2, "loss": 1.0}, {"step": 2, "eval_loss": 9.0}, {"step": 3, "loss": 0.4},
               {"step": 7, "loss": 0.1}]  # windows of 2, 1 and 4 steps, e.g. over a resume at step 3
    totals = metrics.add_run_totals(metrics.add_run_totals(None, 2.0, 48), 2.0, 64)
    assert totals == {"train_runtime": 4.0, "train_samples": 112}
    result = metrics.whole_run_metrics(history, totals, steps=7)
    assert result["train_loss"] == pytest.approx((2 * 1.0 + 1 * 0.4 + 4 * 0.1) / 7)
    assert (result["train_steps"], result["train_runtime"]) == (7, 4.0)
    assert (result["train_samples_per_second"], result["train_steps_per_second"]) == (28.0, 1.75)
