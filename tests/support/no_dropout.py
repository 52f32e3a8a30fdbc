"""The smoke assets with dropout off, for proofs that compare runs which split the same batches differently.

With dropout on, each process draws its own masks: a run on 1 process and one on 2 would differ by their
masks, not by how they batch. Plain Python: the proofs of either loop import it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def copy_without_dropout(assets: Path, folder: Path) -> Path:
    """Copy the smoke model and its train and validation files from assets into folder, with every dropout
    of the model set to 0; returns folder."""
    shutil.copytree(assets / "tiny-bert", folder / "tiny-bert")
    for name in ("train.jsonl", "validation.jsonl"):
        shutil.copy(assets / name, folder / name)
    config_path = folder / "tiny-bert" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0)
    config_path.write_text(json.dumps(config))
    return folder
