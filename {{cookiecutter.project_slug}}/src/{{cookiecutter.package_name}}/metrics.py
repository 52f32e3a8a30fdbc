"""Classification metrics over exactly the examples given, metrics.json, and the training curves."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def classification_metrics(predictions: np.ndarray, labels: np.ndarray, label_names: Sequence[str]) -> dict:
    """Accuracy, macro-F1, per-class precision/recall/F1/support and the confusion matrix.

    The confusion matrix has a row per true label and a column per predicted label, in id order.
    A class absent from both predictions and labels does not count towards the macro average.
    """
    predictions, labels = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    confusion = np.zeros((len(label_names), len(label_names)), dtype=np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    per_class, f1_scores = {}, []
    for index, name in enumerate(label_names):
        hits, predicted, actual = confusion[index, index], confusion[:, index].sum(), confusion[index].sum()
        f1 = 2 * hits / (predicted + actual) if predicted + actual else 0.0
        if predicted + actual:
            f1_scores.append(f1)
        per_class[name] = {"precision": float(hits / predicted) if predicted else 0.0,
                           "recall": float(hits / actual) if actual else 0.0, "f1": float(f1), "support": int(actual)}
    return {
        "accuracy": float(np.trace(confusion) / labels.size) if labels.size else 0.0,
        "f1_macro": float(np.mean(f1_scores)) if f1_scores else 0.0,
        "num_examples": int(labels.size),
        "per_class": per_class,
        "confusion_matrix": confusion.tolist(),
    }


def scalars(logs: dict) -> dict[str, float]:
    """The numbers of a log entry, for log lines and TensorBoard (per-class tables stay in metrics.json)."""
    return {key: value for key, value in logs.items() if isinstance(value, (int, float))}


def write_metrics(output_dir: str, metrics: dict) -> Path:
    path = Path(output_dir) / "metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return path


def plot_training_curves(history: list[dict], path: Path) -> list[str]:
    """Train loss, learning rate and every eval metric against the step, in one PNG; returns the series."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    from matplotlib import pyplot as plt

    series = sorted({key for entry in history for key, value in scalars(entry).items()
                     if key in ("loss", "learning_rate") or (key.startswith("eval_") and not key.endswith(
                         ("runtime", "per_second", "num_examples")))})
    if not series:
        return []
    figure, axes = plt.subplots(len(series), 1, figsize=(7, 2.2 * len(series)), sharex=True, squeeze=False)
    for axis, name in zip(axes[:, 0], series, strict=True):
        points = [(entry["step"], entry[name]) for entry in history if name in entry and "step" in entry]
        axis.plot(*zip(*points, strict=True), marker="." if len(points) < 50 else None, label=name)
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return series
