"""The benchmarks' shared pieces: rendering the template, and an imdb-like workload written to disk.

Reviews are drawn from the rendered project's smoke word lists (one token per word with its
tokenizer), with word counts from a log-normal fitted to imdb's review lengths (median about 170
words, a long tail); the tokenizer truncates them at 512 tokens, as bert-base-uncased's does.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[1]
PACKAGE = "text_classifier"  # the default project name's package
MAX_TOKENS = 512


def render(output_dir: Path, **answers: str | bool) -> Path:
    """Render the template with its defaults and these answers; returns the project folder."""
    from cookiecutter.main import cookiecutter  # here: a run on projects rendered earlier needs no cookiecutter

    return Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(output_dir), extra_context=answers))


def smoke_module(project: Path):
    """The rendered project's smoke module, for its word lists and tiny tokenizer."""
    if str(project / "src") not in sys.path:
        sys.path.insert(0, str(project / "src"))
    import importlib

    return importlib.import_module(f"{PACKAGE}.smoke")


def tiny_decoders_module():
    """The template's tiny decoders (tests/support/tiny_decoders.py), which no render ships."""
    support = TEMPLATE / "tests" / "support"
    if str(support) not in sys.path:
        sys.path.insert(0, str(support))
    import importlib

    return importlib.import_module("tiny_decoders")


def imdb_like_rows(smoke, size: int, seed: int, max_words: int) -> list[dict]:
    """Labelled reviews: the label's sentiment words are scattered through neutral ones."""
    rng = random.Random(seed)
    rows = []
    for _ in range(size):
        label = rng.randrange(2)
        length = min(max_words, max(10, int(rng.lognormvariate(5.15, 0.75))))
        words = [rng.choice(smoke.NEUTRAL) for _ in range(length)]
        for _ in range(max(2, length // 10)):
            words[rng.randrange(length)] = rng.choice(smoke.POSITIVE if label else smoke.NEGATIVE)
        rows.append({"text": " ".join(words), "label": label})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def save_model(smoke, model_dir: Path, model_config: dict, seed: int, dtype: str = "float32") -> None:
    """A BertForSequenceClassification of the given size with the smoke tokenizer, via save_pretrained."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = smoke.build_tokenizer()
    tokenizer.model_max_length = MAX_TOKENS
    tokenizer.save_pretrained(model_dir)
    torch.manual_seed(seed)
    # model_config may set a larger vocabulary (bert-base's 30522) than the tokenizer uses.
    config = BertConfig(**{"vocab_size": len(tokenizer), "max_position_embeddings": MAX_TOKENS, "num_labels": 2,
                           **model_config})
    model = BertForSequenceClassification(config).to(getattr(torch, dtype))
    model.save_pretrained(model_dir)


def write_workload(project: Path, data_dir: Path, train_size: int, eval_size: int, model_config: dict,
                   seed: int = 0, max_words: int = 1000) -> None:
    """train.jsonl, validation.jsonl and model/ (tokenizer and weights) under data_dir."""
    smoke = smoke_module(project)
    write_jsonl(data_dir / "train.jsonl", imdb_like_rows(smoke, train_size, seed, max_words))
    write_jsonl(data_dir / "validation.jsonl", imdb_like_rows(smoke, eval_size, seed + 1, max_words))
    save_model(smoke, data_dir / "model", model_config, seed)
