"""--torch_compile, in the render's loop: two torchrun processes on gloo train the smoke model (dropout off)
for 8 steps eagerly, compiled (inductor, gcc here), and compiled again from the compiled run's checkpoint-4.

Compiled batches are padded to multiples of 64 tokens (at most max_seq_length), so the run compiles a graph
per length bucket at most, not one per batch length. Inductor fuses and reorders the arithmetic: compiled
weights match eager ones to a tolerance, not bit for bit. A resumed run compiles anew and ends with the
compiled run's weights. What only a GPU shows (CUDA graphs, the speed) is bench/gpu_check.sh's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import PACKAGE, read_metrics, smoke_flags
from no_dropout import copy_without_dropout
from safetensors.torch import load_file
from warm_launch import torchrun

pytestmark = pytest.mark.slow  # real launches, each compiling on 2 processes

STEPS = 8
BUCKET = 64  # data.COMPILE_BUCKET


def train(output_dir: Path, assets: Path, *flags: str) -> dict:
    torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(assets, output_dir), "--max_steps", str(STEPS),
              "--save_strategy", "steps", "--save_steps", "4", "--logging_steps", "4", "--do_eval", "false",
              "--dataloader_num_workers", "0", *flags], timeout=600)
    return {"metrics": read_metrics(output_dir), "weights": load_file(output_dir / "model.safetensors")}


@pytest.fixture(scope="module")
def assets(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_without_dropout(smoke_assets, tmp_path_factory.mktemp("no_dropout"))


@pytest.fixture(scope="module")
def runs(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    compiled_dir = tmp_path_factory.mktemp("compiled")
    runs = {"eager": train(tmp_path_factory.mktemp("eager"), assets),
            "compiled": train(compiled_dir, assets, "--torch_compile", "true")}
    resumed_dir = tmp_path_factory.mktemp("resumed")
    shutil.copytree(compiled_dir / "checkpoint-4", resumed_dir / "checkpoint-4")
    runs["resumed"] = train(resumed_dir, assets, "--torch_compile", "true")
    return runs


def length_buckets(assets: Path, max_seq_length: int) -> set[int]:
    """The padded lengths the smoke train set's examples fall into."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(assets / "tiny-bert")
    texts = [json.loads(line)["text"] for line in (assets / "train.jsonl").read_text().splitlines() if line]
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_seq_length)["input_ids"]]
    return {min(-(-length // BUCKET) * BUCKET, max_seq_length) for length in lengths}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name].float() - b[name].float()).abs().max().item() for name in a)


def test_compiled_training_matches_eager_in_few_graphs_and_resumes_to_the_same_weights(runs: dict,
                                                                                       assets: Path) -> None:
    eager, compiled, resumed = runs["eager"], runs["compiled"], runs["resumed"]
    assert "compiled_graphs" not in eager["metrics"]
    assert largest_difference(compiled["weights"], eager["weights"]) < 1e-4
    assert compiled["metrics"]["train_loss"] == pytest.approx(eager["metrics"]["train_loss"], rel=1e-4)
    buckets = length_buckets(assets, 128)  # configs/smoke.yaml's max_seq_length
    assert len(buckets) >= 2, buckets  # else the bound below would prove nothing
    assert 1 <= compiled["metrics"]["compiled_graphs"] <= len(buckets), compiled["metrics"]
    assert resumed["metrics"]["compiled_graphs"] >= 1  # the resumed process compiled again ...
    assert largest_difference(resumed["weights"], compiled["weights"]) < 1e-6  # ... to the same weights
