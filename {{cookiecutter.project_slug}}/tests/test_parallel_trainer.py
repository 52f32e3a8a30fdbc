"""parallel.py's --fsdp under the Trainer: FSDP2 through transformers' fsdp_config, on GPUs only. What accelerate
receives is checked here, in process (no torchrun, no network); the sharded training itself runs on GPUs
(the template's bench/gpu_check.sh).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REQUIRED, package_module, smoke_flags
from test_settings import verdict
from transformers import AutoModelForSequenceClassification

config = package_module("config")
ConfigError = config.ConfigError
TrainingArguments = package_module("training_args").TrainingArguments
parallel = package_module("parallel")

# No torchrun or accelerate settings from the shell; no accelerate state left for the next module.
pytestmark = pytest.mark.usefixtures("isolated_process")


def parse(*argv: str) -> TrainingArguments:
    return config.parse_args(TrainingArguments, [*REQUIRED, *argv])[2]


@pytest.fixture
def on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing resolves the device as on one GPU, with --mixed_precision's answer for it left at no (fp32)."""
    settings = package_module("device").DeviceSettings(use_cpu=False, ddp_backend=None, precision="no")
    monkeypatch.setattr(package_module("training_args"), "training_device_settings", lambda args: settings)


def test_fsdp_is_off_by_default_so_ddp_stays() -> None:
    training_args = parse()
    assert training_args.fsdp is False and training_args.fsdp_plugin_args is None


@pytest.mark.usefixtures("on_a_gpu")
@pytest.mark.parametrize("flag", [["--fsdp", "true"], ["--fsdp"]], ids=["--fsdp true", "--fsdp"])
def test_fsdp_true_sets_transformers_fsdp2_settings_without_its_string_deprecation(flag: list[str]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        training_args = parse(*flag)
    assert [str(warning.message) for warning in caught if "fsdp" in str(warning.message).lower()] == []
    assert training_args.fsdp is True
    assert training_args.fsdp_plugin_args == {"fsdp_version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                              "reshard_after_forward": True, "state_dict_type": "FULL_STATE_DICT",
                                              "cpu_ram_efficient_loading": False}


@pytest.mark.usefixtures("on_a_gpu")
def test_fsdp_names_the_models_transformer_block_class_for_accelerates_wrap(smoke_assets: Path) -> None:
    """Each block sharded on its own: accelerate's default, _no_split_modules, would also name BERT's embeddings,
    and nothing at all for DistilBERT."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    bert = AutoModelForSequenceClassification.from_pretrained(smoke_assets / "tiny-bert")
    distilbert = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2,
                                                                      hidden_dim=64))
    assert distilbert._no_split_modules == set()
    for model, block in ((bert, "BertLayer"), (distilbert, "TransformerBlock")):
        training_args = parse("--fsdp", "true")
        parallel.shard_blocks_of(model, training_args)
        plugin = FullyShardedDataParallelPlugin(**training_args.fsdp_plugin_args)  # as the Trainer builds it
        plugin.set_auto_wrap_policy(model)  # as accelerate's prepare does
        wraps = fsdp2_prepare_auto_wrap_policy(plugin, model)
        assert {type(module).__name__ for module in model.modules() if wraps(module)} == {block}
        assert sum(wraps(module) for module in model.modules()) == 2  # both layers


def test_fsdp_on_cpu_is_one_error_line_from_the_preflight_and_the_worker(
    smoke_assets: Path, tmp_path: Path, capsys: pytest.CaptureFixture, datasets_cache_in_tmp_path: None
) -> None:
    """On CPU accelerate would set the run up as MULTI_CPU and train plain DDP, its parameters never DTensors."""
    argv = [*smoke_flags(smoke_assets, tmp_path / "out"), "--use_cpu", "true", "--fsdp", "true"]
    expected = ("--fsdp true needs GPUs under the Trainer: on CPU accelerate trains plain DDP and shards nothing. "
                "Drop --fsdp, or use this template's native loop, whose --fsdp shards on CPU too")
    assert verdict("preflight", argv, capsys) == verdict("train", argv, capsys) == expected
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["NO", "MULTI_CPU"])
def test_fsdp_where_accelerate_would_not_shard_is_refused_at_the_runs_setup(kind: str) -> None:
    from accelerate.utils import DistributedType

    def run_set_up_as(distributed_type: str, fsdp: bool = True) -> SimpleNamespace:
        return SimpleNamespace(fsdp=fsdp, distributed_state=SimpleNamespace(
            distributed_type=DistributedType[distributed_type]))

    with pytest.raises(ConfigError, match=f"^--fsdp true: accelerate set this run up as {kind}, which it does not "
                                          "shard; start it with torchrun on GPUs"):
        parallel.check_parallel_setup(run_set_up_as(kind))
    parallel.check_parallel_setup(run_set_up_as("MULTI_GPU"))
    parallel.check_parallel_setup(run_set_up_as(kind, fsdp=False))
