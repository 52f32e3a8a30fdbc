"""Offline smoke assets: a tiny BERT, a locally built tokenizer and a learnable synthetic dataset.

`python -m <package>.smoke` writes them under smoke_assets/ with save_pretrained and jsonl, so the
smoke run goes through the same loading code as a real model and dataset, with no network.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import transformers
from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = ["good", "great", "superb", "moving", "brilliant", "fun", "charming", "wonderful"]
NEGATIVE = ["bad", "dull", "awful", "boring", "clumsy", "weak", "tedious", "terrible"]
NEUTRAL = (
    "the a an movie film plot actor scene story director music camera script and of to in it was is "
    "this that with for on as by at from cast ending dialogue picture screen role character"
).split()
LABELS = ("negative", "positive")


def synthetic_examples(count: int, seed: int) -> list[dict[str, str]]:
    """Reviews of long-tailed length whose label is the sentiment that outnumbers the other."""
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        label = rng.randrange(2)
        length = min(120, max(6, int(rng.lognormvariate(3.0, 0.7))))
        words = [rng.choice(NEUTRAL) for _ in range(length)]
        own, other = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
        strong = max(2, length // 3)
        for _ in range(strong):
            words[rng.randrange(length)] = rng.choice(own)
        for _ in range(rng.randrange(strong // 2 + 1)):
            words[rng.randrange(length)] = rng.choice(other)
        examples.append({"text": " ".join(words), "label": LABELS[label]})
    return examples


def build_tokenizer() -> BertTokenizer:
    vocab = SPECIAL_TOKENS + sorted(set(POSITIVE + NEGATIVE + NEUTRAL))
    return BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, model_max_length=128)


def build_model(vocab_size: int, seed: int) -> BertForSequenceClassification:
    import torch

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=128,
        num_labels=len(LABELS),
    )
    return BertForSequenceClassification(config)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_smoke_assets(output_dir: str | Path, train_size: int = 512, eval_size: int = 101, seed: int = 0) -> Path:
    """Write tiny-bert/, train.jsonl and validation.jsonl; the same files for the same arguments."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(output_dir / "tiny-bert")
    build_model(len(tokenizer), seed).save_pretrained(output_dir / "tiny-bert")
    write_jsonl(output_dir / "train.jsonl", synthetic_examples(train_size, seed))
    write_jsonl(output_dir / "validation.jsonl", synthetic_examples(eval_size, seed + 1))
    return output_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="smoke_assets")
    parser.add_argument("--train_size", type=int, default=512)
    parser.add_argument("--eval_size", type=int, default=101, help="odd on purpose: tests exact eval counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bar in logs
    path = make_smoke_assets(args.output_dir, args.train_size, args.eval_size, args.seed)
    print(f"smoke assets written to {path}/")


if __name__ == "__main__":
    main()
