"""The Trainer variant's flags: transformers.TrainingArguments with device, backend and precision
decided before the Trainer sets up devices, and the checks train.py adds around the Trainer.

In process, one parse per test: no torchrun, no network.
"""

from __future__ import annotations

import itertools
import random
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.state import PartialState
from conftest import REQUIRED, package_module, smoke_flags
from test_settings import verdict
from transformers import AutoModelForSequenceClassification

config = package_module("config")
ConfigError = config.ConfigError
TrainingArguments = package_module("training_args").TrainingArguments
train = package_module("train")

# No torchrun or accelerate settings from the shell; no accelerate state left for the next module
# (the run's setup, train.prepare_run, fills accelerate's process-wide PartialState).
pytestmark = pytest.mark.usefixtures("isolated_process")


def parse(*argv: str) -> TrainingArguments:
    return config.parse_args(TrainingArguments, [*REQUIRED, *argv])[2]


# ---- defaults the Trainer needs ----------------------------------------------------------------


def test_the_length_column_reaches_the_sampler() -> None:
    """The Trainer would drop "length" before its length-grouped sampler reads it; the collator drops it instead."""
    assert parse().remove_unused_columns is False


# ---- device, backend and precision, resolved while parsing --------------------------------------


def test_mixed_precision_defaults_to_auto_and_reads_back_as_the_resolved_precision() -> None:
    """transformers' own __post_init__ sets an attribute of the same name (what the Trainer hands to
    Accelerator) from fp16/bf16, so after parsing the field holds the resolved precision, not 'auto'."""
    training_args = parse()
    resolved = "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "no"
    assert training_args.mixed_precision == resolved
    if not torch.cuda.is_available():
        assert training_args.mixed_precision == "no"


def test_accelerate_mixed_precision_env_cannot_override_the_resolved_precision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    training_args = parse("--mixed_precision", "no")
    assert (training_args.fp16, training_args.bf16) == (False, False)
    assert training_args.mixed_precision == "no"


def test_device_and_precision_follow_the_machine() -> None:
    training_args = parse()
    assert training_args.ddp_backend is None  # a single process: no backend to choose
    if not torch.cuda.is_available():
        assert training_args.use_cpu is True
        assert (training_args.fp16, training_args.bf16) == (False, False)
    else:
        bf16_ok = torch.cuda.is_bf16_supported(including_emulation=False)
        assert training_args.use_cpu is False
        assert (training_args.fp16, training_args.bf16) == (not bf16_ok, bf16_ok)


def test_parsing_sets_up_no_device_and_starts_no_process_group() -> None:
    """transformers' own __post_init__ sets the devices up (accelerate's PartialState); here the run's setup does."""
    training_args = parse()
    assert PartialState._shared_state == {}
    assert not torch.distributed.is_initialized()
    train.prepare_run(training_args)
    assert PartialState._shared_state != {}
    assert training_args.device == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))


def test_contradictory_precision_flags_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--fp16 and --bf16"):
        parse("--fp16", "true", "--bf16", "true")


def test_an_unknown_report_to_is_a_config_error_naming_the_integrations_transformers_supports() -> None:
    with pytest.raises(ConfigError, match="^bogus is not supported, only .*, .* are supported"):
        parse("--report_to", "bogus")


# ---- --fsdp: FSDP2 through transformers' fsdp_config, on GPUs only ----------------------------------


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
        train.shard_blocks_of(model, training_args)
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
        train.check_fsdp_applies(run_set_up_as(kind))
    train.check_fsdp_applies(run_set_up_as("MULTI_GPU"))
    train.check_fsdp_applies(run_set_up_as(kind, fsdp=False))


# ---- the length-grouped order: a function of (seed, epoch) only -----------------------------------


def trainer_at(epoch: float, seed: int = 42, world_size: int = 2) -> SimpleNamespace:
    return SimpleNamespace(args=SimpleNamespace(train_batch_size=4, gradient_accumulation_steps=2, seed=seed,
                                                world_size=world_size), state=SimpleNamespace(epoch=epoch))


def sampler_at(epoch: float, seed: int = 42) -> list[int]:
    """The order a fresh EpochSeededLengthGroupedSampler gives when the Trainer stands at `epoch`."""
    lengths = [(7 * index) % 50 + 1 for index in range(64)]
    return list(train.EpochSeededLengthGroupedSampler(trainer_at(epoch, seed), lengths))


def test_length_grouped_order_is_the_same_on_every_rank_and_new_each_epoch() -> None:
    assert sampler_at(0.0) == sampler_at(0.0)  # two ranks, or two runs
    assert sampler_at(1.0) != sampler_at(0.0)
    assert sampler_at(0.0, seed=7) != sampler_at(0.0)
    assert sorted(sampler_at(1.0)) == list(range(64))


def test_a_run_resumed_mid_epoch_replays_that_epochs_order() -> None:
    """Upstream the generator carries on from epoch to epoch and no checkpoint saves it."""
    sampler = train.EpochSeededLengthGroupedSampler(trainer_at(0.0), [(7 * index) % 50 + 1 for index in range(64)])
    list(sampler)  # epoch 0 drawn: a carried-on generator would now be elsewhere
    sampler.trainer.state.epoch = 1.0
    uninterrupted = list(sampler)
    assert sampler_at(1.5) == uninterrupted  # a fresh process resumed half-way through epoch 1


def test_the_ranks_batches_at_each_step_come_from_one_step_of_similar_lengths() -> None:
    """accelerate deals the loader's batches (train_batch_size each) out to the ranks in turn."""
    lengths = random.Random(0).sample(range(6, 600), 96)
    order = list(train.EpochSeededLengthGroupedSampler(trainer_at(0.0), lengths))
    batches = [order[i:i + 4] for i in range(0, 96, 4)]
    for step in range(0, len(batches), 4):  # 2 ranks x 2 accumulation steps of 4 examples
        dealt = [[lengths[i] for i in batch] for batch in batches[step:step + 4]]
        assert all(min(earlier) >= max(later) for earlier, later in itertools.pairwise(dealt))


# ---- train.py's checks around the Trainer -------------------------------------------------------


def test_world_size_without_a_process_group_is_refused_naming_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not torch.distributed.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE=2 but this process would train with world size 1"):
        train.check_really_distributed(1)
    # Even a Trainer that claims world size 2 is refused while no process group spans it.
    with pytest.raises(RuntimeError, match=r"process group size 1"):
        train.check_really_distributed(2)


def test_a_plain_single_process_run_passes_the_distribution_check(monkeypatch: pytest.MonkeyPatch) -> None:
    assert train.check_really_distributed(1) is None  # WORLD_SIZE unset
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert train.check_really_distributed(1) is None


def test_trainer_does_not_let_the_model_scale_the_loss_by_items_in_batch(smoke_assets: Path, tmp_path: Path) -> None:
    """The Trainer must not believe the model averages the loss over num_items_in_batch itself.

    BERT's classification head takes **kwargs but ignores num_items_in_batch and returns a per-batch
    mean. With accepts_loss_kwargs True the Trainer would multiply that loss (and the gradients) by
    the world size under DDP and skip dividing by the gradient-accumulation steps.
    """
    flags = [*smoke_flags(smoke_assets, tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    model_args, data_args, training_args = config.parse_args(TrainingArguments, flags)
    train.prepare_run(training_args)
    trainer = train.build_trainer(model_args, data_args, training_args)
    assert trainer.model.accepts_loss_kwargs is False
    assert trainer.model_accepts_loss_kwargs is False


def test_the_trainers_loader_workers_start_with_the_projects_sigterm_handling(smoke_assets: Path,
                                                                            tmp_path: Path) -> None:
    # accelerate wraps the DataLoader that starts the workers: a worker_init_fn set on the wrapper never runs.
    flags = [*smoke_flags(smoke_assets, tmp_path / "out"), "--cache_dir", str(tmp_path / "cache"),
             "--dataloader_num_workers", "1"]
    model_args, data_args, training_args = config.parse_args(TrainingArguments, flags)
    train.prepare_run(training_args)
    trainer = train.build_trainer(model_args, data_args, training_args)
    for loader in (trainer.get_train_dataloader(), trainer.get_eval_dataloader()):
        worker_init_fn = loader.base_dataloader.worker_init_fn
        assert worker_init_fn.func is package_module("stopping")._end_on_parent_sigterm_then


def test_the_trainers_eval_batches_come_longest_first(smoke_assets: Path, tmp_path: Path) -> None:
    flags = [*smoke_flags(smoke_assets, tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    model_args, data_args, training_args = config.parse_args(TrainingArguments, flags)
    train.prepare_run(training_args)
    trainer = train.build_trainer(model_args, data_args, training_args)
    masks = [batch["attention_mask"] for batch in trainer.get_eval_dataloader()]
    lengths = [int(length) for mask in masks for length in mask.sum(dim=1)]
    assert len(lengths) == len(trainer.eval_dataset) > 2 * training_args.per_device_eval_batch_size
    assert lengths == sorted(lengths, reverse=True)  # every row once, longest first
    assert [mask.shape[1] for mask in masks] == [max(mask.sum(dim=1)) for mask in masks]  # padded to its longest


@pytest.mark.parametrize("name", ["_get_train_sampler", "_get_eval_sampler", "_run_epoch"])
def test_a_trainer_without_a_private_method_this_project_overrides_stops_the_run_in_one_line(
    smoke_assets: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, name: str,
    datasets_cache_in_tmp_path: None,
) -> None:
    import transformers

    assert name in package_module("train").ClassificationTrainer.PRIVATE_OVERRIDES
    monkeypatch.delattr(transformers.Trainer, name)  # as a transformers that renamed it would be
    argv = [*smoke_flags(smoke_assets, tmp_path / "out"), "--max_steps", "1", "--save_strategy", "no"]
    line = verdict("train", argv, capsys)
    expected = f"transformers {transformers.__version__}: Trainer has no {name}, "
    assert line is not None and line.startswith(expected), line
    assert not (tmp_path / "out" / "model.safetensors").exists()
