"""modeling.py: loading the model and tokenizer, label heads, fp32 weights and the refusals' words.

The model and tokenizer are the tiny offline ones from smoke.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import PACKAGE, names_from, package_module, task_of
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

ConfigError, ModelArguments = names_from("config", "ConfigError", "ModelArguments")
load_model, load_tokenizer = names_from("modeling", "load_model", "load_tokenizer")
smoke = package_module("smoke")

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


def test_load_model_names_the_labels_and_keeps_a_head_of_the_same_size(smoke_assets: Path) -> None:
    folder = smoke_assets / "tiny-bert"
    model = load_model(ModelArguments(model_name_or_path=str(folder)), task_of("negative", "positive"))
    assert model.config.num_labels == 2
    assert model.config.id2label == dict(enumerate(["negative", "positive"]))
    assert model.config.label2id == dict(negative=0, positive=1)
    saved = load_file(folder / "model.safetensors")
    assert torch.equal(model.classifier.weight, saved["classifier.weight"])


def test_checkpoint_with_another_label_count_is_refused_unless_asked_for_a_fresh_head(smoke_assets: Path) -> None:
    folder = smoke_assets / "tiny-bert"
    with pytest.raises(ConfigError, match="--ignore_mismatched_sizes true"):
        load_model(ModelArguments(model_name_or_path=str(folder)), task_of("a", "b", "c"))
    fresh_head = ModelArguments(model_name_or_path=str(folder), ignore_mismatched_sizes=True)
    model = load_model(fresh_head, task_of("a", "b", "c"))
    assert model.classifier.out_features == 3
    assert model.classifier.weight.shape == (3, 64)
    assert model.config.id2label == dict(enumerate(["a", "b", "c"]))
    saved = load_file(folder / "model.safetensors")
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, saved["bert.embeddings.word_embeddings.weight"])


def test_load_model_gives_fp32_weights_even_from_a_half_precision_checkpoint(
    smoke_assets: Path, tmp_path: Path
) -> None:
    """Weights train in fp32 (mixed precision is autocast's job): AdamW on fp16 weights loses small updates."""
    half = tmp_path / "tiny-bert-fp16"
    AutoModelForSequenceClassification.from_pretrained(smoke_assets / "tiny-bert").half().save_pretrained(half)
    assert {tensor.dtype for tensor in load_file(half / "model.safetensors").values()} == {torch.float16}
    model = load_model(ModelArguments(model_name_or_path=str(half)), task_of("negative", "positive"))
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}


def test_load_tokenizer_from_the_folder_or_tokenizer_name(smoke_assets: Path, tmp_path: Path) -> None:
    folder = str(smoke_assets / "tiny-bert")
    tokenizer = load_tokenizer(ModelArguments(model_name_or_path=folder))
    reference = smoke.build_tokenizer()
    assert len(tokenizer) == len(reference)
    assert tokenizer("good movie")["input_ids"] == reference("good movie")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(tokenizer("good movie")["input_ids"]) == ["[CLS]", "good", "movie", "[SEP]"]
    assert tokenizer.model_max_length == 128
    elsewhere = load_tokenizer(ModelArguments(model_name_or_path=str(tmp_path / "missing"), tokenizer_name=folder))
    assert len(elsewhere) == len(reference)


@pytest.mark.parametrize("loader", [load_model, load_tokenizer], ids=["model", "tokenizer"])
def test_missing_model_path_is_refused(tmp_path: Path, loader) -> None:
    missing = str(tmp_path / "no-such-model")
    args = ModelArguments(model_name_or_path=missing)
    call = (lambda: loader(args, task_of("a", "b"))) if loader is load_model else (lambda: loader(args))
    with pytest.raises(ConfigError, match=f"--model_name_or_path '{missing}' could not be loaded.*Offline?"):
        call()


def test_missing_smoke_assets_message_says_how_to_create_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a repo where someone ran the smoke module would have the folder
    with pytest.raises(ConfigError, match=f"Create the smoke assets first: python -m {PACKAGE}.smoke"):
        load_model(ModelArguments(model_name_or_path="smoke_assets/tiny-bert"), task_of("a", "b"))
    with pytest.raises(ConfigError, match=f"python -m {PACKAGE}.smoke"):
        load_tokenizer(ModelArguments(model_name_or_path="smoke_assets/tiny-bert"))


def test_missing_smoke_assets_hint_also_for_a_dotted_or_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("./smoke_assets/tiny-bert", str(tmp_path / "smoke_assets" / "tiny-bert")):
        with pytest.raises(ConfigError, match=f"python -m {PACKAGE}.smoke"):
            load_model(ModelArguments(model_name_or_path=name), task_of("a", "b"))
