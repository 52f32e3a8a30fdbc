"""Accuracy as an `evaluate` metric in a local folder: run_classification.py's --metric_name bench/accuracy
loads it without the Hugging Face Hub (evaluate.load("accuracy") would download it)."""

import datasets
import evaluate


class Accuracy(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description="The fraction of predictions equal to their reference.", citation="", inputs_description="",
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references) -> dict:
        return {"accuracy": sum(int(p == r) for p, r in zip(predictions, references, strict=True)) / len(references)}
