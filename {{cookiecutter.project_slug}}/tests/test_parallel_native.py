"""parallel.py's --fsdp in the native loop, in this process (no torchrun): its flag and the settings it refuses,
and a run of one process, which shards nothing. FSDP on two processes, trained for real: the template's proofs.
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import REQUIRED, package_module
from test_native_loop import build_job  # noqa: F401 - a fixture of this module too

config = package_module("config")
ConfigError = config.ConfigError
TrainingArguments = package_module("training_args").TrainingArguments
parallel = package_module("parallel")

# --fsdp refuses a torch older than parallel.FSDP_SINCE.
needs_fsdp_torch = pytest.mark.skipif(torch.__version__ < parallel.FSDP_SINCE,
                                      reason="--fsdp needs a newer torch (parallel.FSDP_SINCE)")


def parse(*flags: str) -> TrainingArguments:
    return config.parse_args(TrainingArguments, [*REQUIRED, *flags])[2]


def test_fsdp_is_off_by_default_so_ddp_stays() -> None:
    """transformers' --fsdp is a string of FSDP options; here true or false."""
    assert parse().fsdp is False


@needs_fsdp_torch
@pytest.mark.parametrize(("flag", "value", "default"), [
    ("--ddp_find_unused_parameters", "true", "False"), ("--ddp_bucket_cap_mb", "50", "None"),
    ("--ddp_broadcast_buffers", "true", "False"),
])
def test_fsdp_refuses_the_ddp_settings_it_would_ignore(flag: str, value: str, default: str) -> None:
    assert parse("--fsdp", "true").fsdp
    parsed_value = value.capitalize() if default == "False" else value  # as the message prints the parsed bool
    message = f"{flag} {parsed_value} is a DDP setting, which --fsdp does not use; leave it at {default}"
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse("--fsdp", "true", flag, value)


def test_fsdp_is_refused_with_a_torch_whose_fsdp2_trains_to_other_weights(monkeypatch) -> None:
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.9.1+cu128"))
    with pytest.raises(ConfigError, match=r"^--fsdp needs torch 2\.10 or newer \(this is 2\.9\.1\+cu128, "):
        parse("--fsdp", "true")


@needs_fsdp_torch
def test_fsdp_on_one_process_trains_the_whole_model_after_finding_its_blocks(build_job, caplog) -> None:  # noqa: F811
    """The config of a multi-GPU FSDP run, debugged on one process: accepted, and nothing is sharded."""
    with caplog.at_level("INFO"):
        job = build_job("--fsdp", "true")
    assert job.model is job.module and not parallel.is_sharded(job.module)
    assert "--fsdp on one process: nothing to shard, the model trains whole" in caplog.text
    assert parallel.transformer_blocks(job.module) is job.module.bert.encoder.layer


def test_fsdp_refuses_a_model_without_repeated_blocks() -> None:
    with pytest.raises(ConfigError, match=r"^--fsdp: found no list of repeated transformer blocks in "
                                          r"Sequential to shard one by one; train it without --fsdp$"):
        parallel.transformer_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)))
