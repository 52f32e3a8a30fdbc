"""Accuracy and macro-F1, computed over exactly the examples given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def classification_metrics(predictions: np.ndarray, labels: np.ndarray, num_labels: int) -> dict[str, float]:
    predictions = np.asarray(predictions).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    f1_scores = []
    for label in range(num_labels):
        true_positive = np.sum((predictions == label) & (labels == label))
        predicted = np.sum(predictions == label)
        actual = np.sum(labels == label)
        if predicted + actual == 0:
            continue  # a class absent from both does not count towards the macro average
        f1_scores.append(2 * true_positive / (predicted + actual))
    return {
        "accuracy": float(np.mean(predictions == labels)) if labels.size else 0.0,
        "f1_macro": float(np.mean(f1_scores)) if f1_scores else 0.0,
        "num_examples": int(labels.size),
    }


def write_metrics(output_dir: str, metrics: dict) -> Path:
    path = Path(output_dir) / "metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return path
