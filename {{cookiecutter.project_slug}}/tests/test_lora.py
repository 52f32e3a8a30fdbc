"""lora.py: LoRA's flags, read by the training command's parser, and the adapters load_model adds. Training
with LoRA, its checkpoints, resuming and merge_lora are proved on real runs by the template's
tests/proofs/test_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REQUIRED, names_from, parse_args, task_of

ConfigError, ModelArguments = names_from("config", "ConfigError", "ModelArguments")
LoraArguments, check_same_rank = names_from("lora", "LoraArguments", "check_same_rank")
load_model, load_tokenizer = names_from("modeling", "load_model", "load_tokenizer")

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


def test_the_flags_take_loras_default_to_training_every_weight_and_a_checkpoint_of_another_rank_is_refused(
    tmp_path: Path,
) -> None:
    model_args, _, _ = parse_args([*REQUIRED, "--lora_r", "8", "--lora_target_modules", "q_proj,v_proj"])
    assert isinstance(model_args, LoraArguments) and isinstance(model_args, ModelArguments)
    assert (model_args.lora_r, model_args.lora_alpha, model_args.lora_dropout) == (8, 16, 0.05)
    assert model_args.lora_target_modules == "q_proj,v_proj"
    assert parse_args(REQUIRED)[0].lora_r == 0
    with pytest.raises(ConfigError, match=r"^--lora_alpha 0.0: must be > 0$"):
        parse_args([*REQUIRED, "--lora_alpha", "0"])
    (tmp_path / "adapter_config.json").write_text('{"r": 8}')
    check_same_rank(tmp_path, 8)
    with pytest.raises(ConfigError, match="was trained with --lora_r 8, this run has --lora_r 4: pass --lora_r 8"):
        check_same_rank(tmp_path, 4)
    with pytest.raises(ConfigError, match="was trained with --lora_r 0, this run has --lora_r 8"):
        check_same_rank(tmp_path / "no-adapter", 8)


def test_adapters_on_a_layer_the_forward_never_uses_are_frozen(tiny_bigbird: Path) -> None:
    """BigBird's classifier never reads its pooler (test_modeling.py): its adapters are frozen too."""
    args = LoraArguments(model_name_or_path=str(tiny_bigbird), lora_r=4)
    model = load_model(args, task_of("negative", "positive"), load_tokenizer(args), freeze_unused=True)
    pooler = "base_model.model.bert.pooler"
    frozen = {name for name, parameter in model.named_parameters() if not parameter.requires_grad}
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert {f"{pooler}.lora_A.default.weight", f"{pooler}.lora_B.default.weight"} <= frozen
    assert not any(name.startswith(pooler) for name in trainable)
    assert any(".lora_" in name for name in trainable) and any(".modules_to_save." in name for name in trainable)
