"""smoke.py: the offline smoke assets are deterministic, of the sizes asked for, and in vocabulary, for every
task (single-label, pairs, regression and multi-label). That their labels are balanced and learnable is the
template's proof (its tests/proofs/test_smoke_data.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import EVAL_SIZE, TRAIN_SIZE, package_module, read_jsonl
from safetensors.torch import load_file

smoke = package_module("smoke")

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


def test_make_smoke_assets_is_deterministic(tmp_path: Path) -> None:
    first, second = smoke.make_smoke_assets(tmp_path / "a"), smoke.make_smoke_assets(tmp_path / "b")
    files = sorted(str(p.relative_to(first)) for p in first.rglob("*") if p.is_file())
    assert {"train.jsonl", "validation.jsonl", "tiny-bert/config.json", "tiny-bert/model.safetensors"} <= set(files)
    assert files == sorted(str(p.relative_to(second)) for p in second.rglob("*") if p.is_file())
    for name in files:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    weights_a, weights_b = (load_file(d / "tiny-bert" / "model.safetensors") for d in (first, second))
    assert all(torch.equal(weights_a[key], weights_b[key]) for key in weights_a)
    other_seed = smoke.make_smoke_assets(tmp_path / "c", seed=1)
    for name in (name for name in files if name.endswith(".jsonl")):  # every task's train and validation files
        assert (other_seed / name).read_bytes() != (first / name).read_bytes(), name


# ---- pairs, regression and multi-label tasks ---------------------------------------------------

TASK_COLUMNS = {
    "pairs": {"sentence1": str, "sentence2": str, "label": str},
    "regression": {"text": str, "label": float},  # 1.0, not 1, so datasets reads a float column
    "multilabel": {"text": str, "labels": list},
}


@pytest.mark.parametrize("task", list(TASK_COLUMNS))
def test_smoke_task_files_hold_their_columns_and_types_in_vocabulary(smoke_assets: Path, task: str) -> None:
    tokenizer = smoke.build_tokenizer()
    for split, size in (("train", TRAIN_SIZE), ("validation", EVAL_SIZE)):
        rows = read_jsonl(smoke_assets / task / f"{split}.jsonl")
        assert len(rows) == size
        assert all({key: type(value) for key, value in row.items()} == TASK_COLUMNS[task] for row in rows)
        texts = [" ".join(row[key] for key in ("text", "sentence1", "sentence2") if key in row) for row in rows]
        assert all(6 <= len(text.split()) <= 40 for text in texts)
        assert all(tokenizer.unk_token_id not in ids for ids in tokenizer(texts)["input_ids"])
