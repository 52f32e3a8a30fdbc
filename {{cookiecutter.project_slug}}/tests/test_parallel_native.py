"""parallel.py's --fsdp in this process (two, trained for real: the template's proofs)."""

from __future__ import annotations

import pytest
import torch
from conftest import package_module
from test_native_loop import build_job  # noqa: F401 - a fixture of this module too
from test_training_args import ConfigError, parse

parallel = package_module("parallel")
needs_fsdp_torch = pytest.mark.skipif(torch.__version__ < parallel.FSDP_SINCE, reason="--fsdp needs a newer torch")


@needs_fsdp_torch
@pytest.mark.parametrize(("flag", "value", "parsed", "default"), [
    ("--ddp_find_unused_parameters", "true", "True", "False"), ("--ddp_bucket_cap_mb", "50", "50", "None"),
    ("--ddp_broadcast_buffers", "true", "True", "False")])
def test_fsdp_is_off_by_default_and_refuses_the_ddp_settings_it_would_ignore(flag, value, parsed, default) -> None:
    assert parse().fsdp is False and parse("--fsdp", "true").fsdp  # transformers' fsdp: a string of options
    with pytest.raises(ConfigError, match=f"^{flag} {parsed} is a DDP setting, which --fsdp does not use; leave "
                                          f"it at {default} or train without --fsdp$"):
        parse("--fsdp", "true", flag, value)


@needs_fsdp_torch
def test_fsdp_on_one_process_trains_the_whole_model_after_finding_its_blocks(build_job, caplog) -> None:  # noqa: F811
    with caplog.at_level("INFO"):
        job = build_job("--fsdp", "true")
    assert job.model is job.module and not parallel.is_sharded(job.module)
    assert "--fsdp on one process: nothing to shard, the model trains whole" in caplog.text
    assert parallel.transformer_blocks(job.module) is job.module.bert.encoder.layer


def test_fsdp_refuses_a_model_without_repeated_blocks_and_an_older_torch(
        monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"^--fsdp: found no list of repeated transformer blocks in "
                                          r"Sequential to shard one by one; train it without --fsdp$"):
        parallel.transformer_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)))
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.9.1+cu128"))
    with pytest.raises(ConfigError, match=r"^--fsdp needs torch 2\.10 or newer \(this is 2\.9\.1\+cu128, "):
        parse("--fsdp", "true")
