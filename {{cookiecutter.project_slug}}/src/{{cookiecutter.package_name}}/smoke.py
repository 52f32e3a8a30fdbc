"""Offline smoke assets: a tiny BERT, a locally built tokenizer and learnable synthetic datasets.

`python -m <package>.smoke` writes them under smoke_assets/ with save_pretrained and jsonl, so the
smoke run goes through the same loading code as a real model and dataset, with no network. Next to
the sentiment task (train.jsonl, validation.jsonl) it writes one folder per other task type:
pairs/ (sentence pairs), regression/ (a float score) and multilabel/ (a list of topics).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
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
PAIR_LABELS = ("different", "same")
TOPICS = {
    "sports": ["football", "tennis", "goal", "match", "team", "coach"],
    "food": ["pasta", "bread", "cheese", "soup", "dessert", "chef"],
    "music": ["guitar", "song", "piano", "drums", "singer", "concert"],
    "travel": ["train", "airport", "hotel", "beach", "passport", "journey"],
}
WORDS = sorted({*POSITIVE, *NEGATIVE, *NEUTRAL, *(word for words in TOPICS.values() for word in words)})


def synthetic_examples(count: int, seed: int) -> list[dict[str, str]]:
    """Reviews of long-tailed length whose label is the sentiment that outnumbers the other: neutral filler
    with about a third of its words of the label's sentiment and fewer of the other."""
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


def pair_examples(count: int, seed: int) -> list[dict[str, str]]:
    """Two short reviews labelled by whether they share a sentiment: an XOR that neither tells alone.

    Two thirds of each review's words carry its sentiment, none the other's: with sparse or mixed cues
    the tiny BERT memorises the 512 pairs instead of learning to compare them.
    """
    rng = random.Random(seed)
    same_flags = [index % 2 for index in range(count)]  # balanced classes, in random order
    rng.shuffle(same_flags)
    examples = []
    for same in same_flags:
        first = rng.randrange(2)  # independent of the label, so sentence1 alone is a coin toss
        sentences = []
        for label in (first, first if same else 1 - first):
            length = rng.randint(6, 10)
            words = [rng.choice(NEUTRAL) for _ in range(length)]
            for position in rng.sample(range(length), 2 * length // 3):
                words[position] = rng.choice(POSITIVE if label else NEGATIVE)
            sentences.append(" ".join(words))
        examples.append({"sentence1": sentences[0], "sentence2": sentences[1], "label": PAIR_LABELS[same]})
    return examples


def regression_examples(count: int, seed: int) -> list[dict[str, str | float]]:
    """Reviews scored 0-5 by the share of positive among their sentiment words, plus a little noise."""
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        length = rng.randint(8, 30)
        words = [rng.choice(NEUTRAL) for _ in range(length)]
        sentiment = rng.randint(2, max(2, length // 3))
        positive = rng.randint(0, sentiment)
        for rank, position in enumerate(rng.sample(range(length), sentiment)):
            words[position] = rng.choice(POSITIVE if rank < positive else NEGATIVE)
        score = min(5.0, max(0.0, 5.0 * positive / sentiment + rng.gauss(0.0, 0.25)))
        examples.append({"text": " ".join(words), "label": round(score, 2)})  # a float even when whole
    return examples


def multilabel_examples(count: int, seed: int) -> list[dict[str, str | list[str]]]:
    """Filler text tagged with each topic (0 to 3 of them) of which it holds two words."""
    rng = random.Random(seed)
    names = list(TOPICS)
    filler = [word for word in NEUTRAL if word not in TOPICS]  # no "music" without the music topic
    examples = []
    for _ in range(count):
        length = rng.randint(6, 12)
        words = [rng.choice(filler) for _ in range(length)]
        topics = sorted(rng.sample(names, rng.choice((0, 1, 1, 2, 2, 3))), key=names.index)
        cues = [word for topic in topics for word in rng.choices(TOPICS[topic], k=2)]
        for position, word in zip(rng.sample(range(length), len(cues)), cues, strict=True):
            words[position] = word
        examples.append({"text": " ".join(words), "labels": topics})
    return examples


TASKS = {"": synthetic_examples, "pairs": pair_examples, "regression": regression_examples,  # "": at the top
         "multilabel": multilabel_examples}


def build_tokenizer() -> BertTokenizer:
    vocab = SPECIAL_TOKENS + WORDS
    return BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, model_max_length=128)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_smoke_assets(output_dir: str | Path, train_size: int = 512, eval_size: int = 101, seed: int = 0) -> Path:
    """Write tiny-bert/ and each TASKS folder's train.jsonl and validation.jsonl: the same arguments give the
    same files, byte for byte."""
    output_dir = Path(output_dir)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(output_dir / "tiny-bert")
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=128, num_labels=len(LABELS))
    BertForSequenceClassification(config).save_pretrained(output_dir / "tiny-bert")
    for task, examples in TASKS.items():
        (output_dir / task).mkdir(exist_ok=True)
        write_jsonl(output_dir / task / "train.jsonl", examples(train_size, seed))
        write_jsonl(output_dir / task / "validation.jsonl", examples(eval_size, seed + 1))
    return output_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="smoke_assets")
    parser.add_argument("--train_size", type=int, default=512, help="examples per task")
    parser.add_argument("--eval_size", type=int, default=101, help="odd on purpose: tests exact eval counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()  # no "Writing model shards" bar in logs
    path = make_smoke_assets(**vars(args))
    print(f"smoke assets written to {path}/")


if __name__ == "__main__":
    main()
