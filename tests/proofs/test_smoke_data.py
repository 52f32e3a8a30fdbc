"""The smoke assets are fit for the proofs that train on them: balanced labels, texts in vocabulary that a
rule can read, sentence pairs that neither sentence decides alone, regression scores that follow the text,
multi-label rows with no topic and with several."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import package_module, read_jsonl

smoke = package_module("smoke")

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


def test_smoke_data_sizes_and_label_balance(tmp_path: Path) -> None:
    assets = smoke.make_smoke_assets(tmp_path)
    train, validation = read_jsonl(assets / "train.jsonl"), read_jsonl(assets / "validation.jsonl")
    assert (len(train), len(validation)) == (512, 101)  # odd eval size on purpose
    for rows in (train, validation):
        assert {row["label"] for row in rows} == {"negative", "positive"}
        assert 0.4 < sum(row["label"] == "positive" for row in rows) / len(rows) < 0.6
    lengths = sorted(len(row["text"].split()) for row in train)
    assert lengths[0] >= 6 and lengths[-1] <= 120
    assert lengths[-1] > 4 * lengths[len(lengths) // 2]  # long-tailed, so length grouping matters


def test_smoke_texts_are_learnable_and_fully_in_vocabulary(tmp_path: Path) -> None:
    assets = smoke.make_smoke_assets(tmp_path)
    validation = read_jsonl(assets / "validation.jsonl")
    positive, negative = set(smoke.POSITIVE), set(smoke.NEGATIVE)

    def rule(text: str) -> str:
        words = text.split()
        return "positive" if sum(w in positive for w in words) > sum(w in negative for w in words) else "negative"

    accuracy = sum(rule(row["text"]) == row["label"] for row in validation) / len(validation)
    assert accuracy > 0.9
    tokenizer = smoke.build_tokenizer()
    ids = tokenizer([row["text"] for row in validation])["input_ids"]
    assert all(tokenizer.unk_token_id not in row for row in ids)


def sentiment_of(text: str) -> str:
    words = text.split()
    positive, negative = sum(w in smoke.POSITIVE for w in words), sum(w in smoke.NEGATIVE for w in words)
    return "positive" if positive > negative else "negative"


def test_smoke_pairs_are_balanced_and_sentence1_alone_does_not_tell_the_label(smoke_assets: Path) -> None:
    rows = read_jsonl(smoke_assets / "pairs" / "train.jsonl")
    assert sum(row["label"] == "same" for row in rows) == len(rows) // 2
    for sentiment in ("negative", "positive"):
        labels = [row["label"] for row in rows if sentiment_of(row["sentence1"]) == sentiment]
        assert 0.4 < labels.count("same") / len(labels) < 0.6, sentiment
    # Both sentences together decide it: the label is the comparison of their sentiments.
    assert all((sentiment_of(row["sentence1"]) == sentiment_of(row["sentence2"])) == (row["label"] == "same")
               for row in rows)


def test_smoke_regression_score_grows_with_the_share_of_positive_words(smoke_assets: Path) -> None:
    rows = read_jsonl(smoke_assets / "regression" / "train.jsonl")
    shares = [sum(w in smoke.POSITIVE for w in words) / sum(w in smoke.POSITIVE + smoke.NEGATIVE for w in words)
              for words in (row["text"].split() for row in rows)]
    scores = [row["label"] for row in rows]
    assert min(scores) >= 0.0 and max(scores) <= 5.0
    assert np.corrcoef(shares, scores)[0, 1] > 0.95


def test_smoke_multilabel_has_texts_with_no_topic_and_with_several(smoke_assets: Path) -> None:
    rows = read_jsonl(smoke_assets / "multilabel" / "train.jsonl")
    counts = [len(row["labels"]) for row in rows]
    assert set(counts) == {0, 1, 2, 3}
    assert counts.count(0) > len(rows) / 10 and sum(count >= 2 for count in counts) > len(rows) / 4
    # A topic is named exactly when one of its words is in the text.
    for row in rows:
        text = set(row["text"].split())
        assert row["labels"] == [topic for topic, words in smoke.TOPICS.items() if text & set(words)]
