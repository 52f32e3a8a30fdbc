"""modeling.py: loading the model and tokenizer, label heads, fp32 weights and the refusals' words. The
model and tokenizer are the tiny offline ones from smoke.py; the model with parameters its forward never
uses is a tiny BigBird (conftest.tiny_bigbird)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from conftest import PACKAGE, names_from, package_module, task_of
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

ConfigError, ModelArguments = names_from("config", "ConfigError", "ModelArguments")
load_model, load_tokenizer = names_from("modeling", "load_model", "load_tokenizer")
modeling = package_module("modeling")
smoke = package_module("smoke")

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


def test_load_model_keeps_a_head_of_the_same_size_and_refuses_another_unless_asked_for_a_fresh_one(
    smoke_assets: Path,
) -> None:
    folder = smoke_assets / "tiny-bert"
    saved = load_file(folder / "model.safetensors")
    model = load_model(ModelArguments(model_name_or_path=str(folder)), task_of("negative", "positive"))
    assert model.config.num_labels == 2
    assert model.config.id2label == dict(enumerate(["negative", "positive"]))
    assert model.config.label2id == dict(negative=0, positive=1)
    assert torch.equal(model.classifier.weight, saved["classifier.weight"])
    with pytest.raises(ConfigError, match="--ignore_mismatched_sizes true"):
        load_model(ModelArguments(model_name_or_path=str(folder)), task_of("a", "b", "c"))
    fresh_head = ModelArguments(model_name_or_path=str(folder), ignore_mismatched_sizes=True)
    model = load_model(fresh_head, task_of("a", "b", "c"))
    assert model.classifier.out_features == 3
    assert model.classifier.weight.shape == (3, 64)
    assert model.config.id2label == dict(enumerate(["a", "b", "c"]))
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, saved["bert.embeddings.word_embeddings.weight"])


def test_load_model_gives_fp32_weights_even_from_a_half_precision_checkpoint_and_no_hub_kernels(
    smoke_assets: Path, tmp_path: Path
) -> None:
    """Weights train in fp32 (mixed precision is autocast's job): AdamW on fp16 weights loses small updates.
    Hub kernels stay off (modeling.LOAD_OPTIONS): on CUDA, eval() would fetch one, offline after training."""
    half = tmp_path / "tiny-bert-fp16"
    AutoModelForSequenceClassification.from_pretrained(smoke_assets / "tiny-bert").half().save_pretrained(half)
    assert {tensor.dtype for tensor in load_file(half / "model.safetensors").values()} == {torch.float16}
    model = load_model(ModelArguments(model_name_or_path=str(half)), task_of("negative", "positive"))
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}
    assert model.use_kernels is False


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
    if loader is load_tokenizer:  # a tokenizer of its own is named by its own flag
        with pytest.raises(ConfigError, match=f"^--tokenizer_name '{missing}' could not be loaded"):
            loader(ModelArguments(model_name_or_path="m", tokenizer_name=missing))


def test_missing_smoke_assets_message_says_how_to_create_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a repo where someone ran the smoke module would have the folder
    for name in ("smoke_assets/tiny-bert", "./smoke_assets/tiny-bert", str(tmp_path / "smoke_assets" / "tiny-bert")):
        with pytest.raises(ConfigError, match=f"Create the smoke assets first: python -m {PACKAGE}.smoke"):
            load_model(ModelArguments(model_name_or_path=name), task_of("a", "b"))
    with pytest.raises(ConfigError, match=f"python -m {PACKAGE}.smoke"):
        load_tokenizer(ModelArguments(model_name_or_path="smoke_assets/tiny-bert"))


# ---- parameters the forward never uses --------------------------------------------------------

def frozen(model: torch.nn.Module) -> set[str]:
    return {name for name, parameter in model.named_parameters() if not parameter.requires_grad}


def test_parameters_the_forward_never_uses_are_frozen_and_named_in_one_line(
    tiny_bigbird: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """BigBird's classifier reads the first token itself: its pooler never gets a gradient, and under DDP
    the bucket holding it would never be all-reduced."""
    args = ModelArguments(model_name_or_path=str(tiny_bigbird))
    tokenizer = load_tokenizer(args)
    with caplog.at_level(logging.INFO, logger=f"{PACKAGE}.modeling"):
        model = load_model(args, task_of("negative", "positive"), tokenizer, freeze_unused=True)
    assert frozen(model) == {"bert.pooler.weight", "bert.pooler.bias"}
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("froze ")]
    assert lines == ["froze 2 parameter tensor(s) (bert.pooler.weight, bert.pooler.bias): the classification "
                     "forward never uses them, so they could not learn, and DDP would wait for their gradients"]
    pooler = model.bert.pooler.weight.numel() + model.bert.pooler.bias.numel()
    total = sum(parameter.numel() for parameter in model.parameters())
    assert f"parameters: {total - pooler} trainable of {total} (" in caplog.text  # counted after freezing
    # Off (--ddp_find_unused_parameters true: DDP searches every step), nothing is frozen.
    assert frozen(load_model(args, task_of("negative", "positive"), tokenizer)) == set()


def test_which_parameters_go_unused_depends_on_the_inputs_so_the_example_is_tokenised_as_training_does(
    smoke_assets: Path,
) -> None:
    """BERT's token type embeddings count as used even when no token_type_ids are passed: the model then
    looks up type 0 from a buffer, and its gradient reaches the embedding, so none is frozen. XLNet adds its
    segment embeddings only when given token_type_ids, which the tokenizer gives; its mask embedding serves
    pretraining alone."""
    from transformers import XLNetConfig, XLNetForSequenceClassification

    args = ModelArguments(model_name_or_path=str(smoke_assets / "tiny-bert"))
    tokenizer = load_tokenizer(args)
    model = load_model(args, task_of("negative", "positive"), tokenizer, freeze_unused=True)
    assert frozen(model) == set()
    inputs = modeling.example_inputs(tokenizer, task_of("negative", "positive"))
    assert "token_type_ids" in inputs
    without_types = {key: value for key, value in inputs.items() if key != "token_type_ids"}
    assert modeling.unused_parameters(model, without_types) == []
    model = XLNetForSequenceClassification(XLNetConfig(vocab_size=len(tokenizer), d_model=32, n_layer=1, n_head=2,
                                                       d_inner=64))
    inputs = modeling.example_inputs(tokenizer, task_of("negative", "positive"))
    assert modeling.unused_parameters(model, inputs) == ["transformer.mask_emb"]
    without_types = {key: value for key, value in inputs.items() if key != "token_type_ids"}
    assert set(modeling.unused_parameters(model, without_types)) == {
        "transformer.mask_emb", "transformer.layer.0.rel_attn.seg_embed", "transformer.layer.0.rel_attn.r_s_bias"}
    assert model.training  # built in train mode: the walk, in eval mode, leaves it as it found it
