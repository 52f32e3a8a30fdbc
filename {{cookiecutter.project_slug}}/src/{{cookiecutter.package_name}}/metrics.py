"""Metrics per problem type over exactly the examples given, log lines, metrics.json, the training curves."""

from __future__ import annotations

import contextlib
import json
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np
from scipy.special import expit, softmax
from tqdm.auto import tqdm


def predict_from_logits(logits: np.ndarray, problem_type: str,
                        threshold: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, scores) from a batch of logits. Single-label: the class id and its softmax probability.
    Multi-label: a 0/1 row per example (the labels whose sigmoid is above the threshold) and those
    probabilities. Regression: the value, twice."""
    logits = np.asarray(logits, dtype=np.float64)
    if problem_type == "regression":
        values = logits.reshape(len(logits), -1)[:, 0]
        return values, values
    if problem_type == "multi_label_classification":
        probabilities = expit(logits)
        return (probabilities > threshold).astype(np.int64), probabilities
    probabilities = softmax(logits, axis=-1)
    return probabilities.argmax(axis=-1), probabilities.max(axis=-1)


def task_metrics(logits: np.ndarray, labels: np.ndarray, problem_type: str, label_names: Sequence[str],
                 threshold: float = 0.5) -> dict:
    predictions, _ = predict_from_logits(logits, problem_type, threshold)
    if problem_type == "regression":
        return regression_metrics(predictions, labels)
    if problem_type == "multi_label_classification":
        return multi_label_metrics(predictions, labels, label_names)
    return classification_metrics(predictions, labels, label_names)


def regression_metrics(predictions: np.ndarray, labels: np.ndarray) -> dict:
    from scipy.stats import pearsonr, spearmanr

    predictions, labels = np.asarray(predictions, dtype=np.float64).reshape(-1), np.asarray(labels).reshape(-1)
    errors = predictions - labels
    correlated = labels.size > 1 and np.ptp(labels) > 0 and np.ptp(predictions) > 0  # else undefined
    return {
        "mse": float(np.mean(errors**2)) if labels.size else 0.0,
        "mae": float(np.mean(np.abs(errors))) if labels.size else 0.0,
        "pearson": float(pearsonr(predictions, labels)[0]) if correlated else 0.0,
        "spearman": float(spearmanr(predictions, labels)[0]) if correlated else 0.0,
        "num_examples": int(labels.size),
    }


def multi_label_metrics(predictions: np.ndarray, labels: np.ndarray, label_names: Sequence[str]) -> dict:
    """Micro- and macro-F1 (over the labels predicted or present), subset accuracy (every label of an
    example right) and per-label figures."""
    predictions = np.asarray(predictions).reshape(-1, len(label_names)).astype(bool)
    labels = np.asarray(labels).reshape(-1, len(label_names)).astype(bool)
    hits, predicted, actual = (predictions & labels).sum(axis=0), predictions.sum(axis=0), labels.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0 where a label has no count: then 0
        figures = np.nan_to_num([hits / predicted, hits / actual, 2 * hits / (predicted + actual)])
    counted = predicted + actual > 0
    total = predicted.sum() + actual.sum()
    return {
        "subset_accuracy": float((predictions == labels).all(axis=1).mean()) if len(labels) else 0.0,
        "f1_micro": float(2 * hits.sum() / total) if total else 0.0,
        "f1_macro": float(figures[2][counted].mean()) if counted.any() else 0.0,
        "num_examples": len(labels),
        "per_class": {name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(n)}
                      for name, p, r, f, n in zip(label_names, *figures, actual, strict=True)},
    }


def classification_metrics(predictions: np.ndarray, labels: np.ndarray, label_names: Sequence[str]) -> dict:
    """Accuracy, macro-F1 and per-class figures (those of one-hot label rows) and the confusion matrix: a row
    per true label, a column per predicted label."""
    one_hot = np.eye(len(label_names), dtype=np.int64)
    predicted, actual = (one_hot[np.asarray(ids).reshape(-1)] for ids in (predictions, labels))
    figures = multi_label_metrics(predicted, actual, label_names)
    return {
        "accuracy": figures["subset_accuracy"],
        **{key: figures[key] for key in ("f1_macro", "num_examples", "per_class")},
        "confusion_matrix": (actual.T @ predicted).tolist(),
    }


def scalars(logs: dict) -> dict[str, float]:
    """A log entry's numbers, as its log line holds them (per-class tables stay in metrics.json)."""
    return {key: value for key, value in logs.items() if isinstance(value, (int, float))}


def write_log_line(step: int, logs: dict) -> dict[str, float]:
    """Print a log entry as both loops do (on rank 0): one JSON line, the step first, numbers as numbers."""
    entry = {"step": step, **scalars(logs)}
    tqdm.write(json.dumps(entry))  # above a progress bar, not through it
    return entry


def library_versions() -> dict[str, str]:
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in ("transformers", "accelerate", "datasets", "tokenizers"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    #% if cookiecutter.include_lora
    versions["peft"] = metadata.version("peft")
    #% endif
    return versions


def write_metrics(output_dir: str, metrics: dict, trained: bool) -> Path:
    """Write output_dir/metrics.json with library_versions(). A run that trained writes it whole; one that
    only evaluated replaces the eval_* figures and keeps the others."""
    path = Path(output_dir) / "metrics.json"
    if not trained and path.is_file():
        kept = {key: value for key, value in json.loads(path.read_text()).items() if not key.startswith("eval_")}
        metrics = kept | {key: value for key, value in metrics.items() if key.startswith("eval_")}
    metrics = metrics | {"versions": library_versions()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return path


def is_finished(output_dir: str, steps_left: int) -> bool:
    return steps_left == 0 and Path(output_dir, "metrics.json").is_file()


def finished_message(output_dir: str, step: int) -> str:
    return (f"{output_dir} holds this run, finished at step {step}: nothing to train, metrics.json kept as it was. "
            f"To evaluate again add --do_train false --model_name_or_path {output_dir}; to train again use a new "
            "--output_dir")


def add_run_totals(earlier: dict | None, runtime: float, samples: int) -> dict:
    """Time and examples trained over the legs of a run that was stopped and resumed."""
    earlier = earlier or {}
    return {"train_runtime": earlier.get("train_runtime", 0.0) + runtime,
            "train_samples": earlier.get("train_samples", 0) + samples}


def whole_run_metrics(history: list[dict], totals: dict, steps: int) -> dict[str, float]:
    """The train figures of metrics.json, over the whole run however many times it was resumed.

    The mean loss comes from the logged losses, each the mean over the steps since the log before:
    both loops also log at every checkpoint and at the last step, so those windows tile the run.
    """
    loss_sum, last_step = 0.0, 0
    for entry in history:
        if "loss" in entry:
            loss_sum, last_step = loss_sum + entry["loss"] * (entry["step"] - last_step), entry["step"]
    runtime = max(totals["train_runtime"], 1e-9)
    return {"train_loss": round(loss_sum / last_step, 6) if last_step else 0.0, "train_steps": steps,
            "train_runtime": round(runtime, 4),
            "train_samples_per_second": round(totals["train_samples"] / runtime, 3),
            "train_steps_per_second": round(steps / runtime, 3)}


def plot_training_curves(history: list[dict], path: Path) -> list[str]:
    """Train loss, learning rate and each eval metric logged at two steps or more (a point is no curve: the
    final evaluation is in metrics.json) against the step, in one PNG; returns the series."""
    points: dict[str, list] = {}
    for entry in (entry for entry in history if "step" in entry):
        for key, value in scalars(entry).items():
            if key in ("loss", "learning_rate") or (key.startswith("eval_") and not key.endswith(
                    ("runtime", "per_second", "num_examples"))):
                points.setdefault(key, []).append((entry["step"], value))
    series = sorted(name for name, logged in points.items() if len(logged) > 1)
    if not series:
        return []
    from matplotlib.figure import Figure  # not pyplot: no display, no global figure to close

    figure = Figure(figsize=(7, 2.2 * len(series)))
    axes = figure.subplots(len(series), 1, sharex=True, squeeze=False)
    for axis, name in zip(axes[:, 0], series, strict=True):
        steps, values = zip(*points[name], strict=True)
        axis.plot(steps, values, marker="." if len(steps) < 50 else None)
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return series
