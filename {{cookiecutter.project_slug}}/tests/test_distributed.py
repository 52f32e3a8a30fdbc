"""device.py and distributed.py in process: backend and precision, rank order, the gradient check and loader
workers. No torchrun and no GPU: process groups and the CPU count are patched per test. The choice of GPU,
with torch.cuda's queries patched, is the template's proof (its tests/proofs/test_gpu_node.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import REQUIRED, names_from, package_module, parse_args

ConfigError = names_from("config", "ConfigError")
device, distributed = package_module("device"), package_module("distributed")
resolve_device_settings = device.resolve_device_settings

pytestmark = pytest.mark.usefixtures("isolated_process")  # offline, one process, no state left behind


# (mixed_precision, cuda available, bf16 supported) -> precision, or None where it is refused.
PRECISION_TABLE = [
    ("auto", False, False, "no"),
    ("auto", False, True, "no"),
    ("auto", True, False, "fp16"),
    ("auto", True, True, "bf16"),
    ("bf16", False, False, "bf16"),  # bf16 autocast works on CPU
    ("bf16", False, True, "bf16"),
    ("bf16", True, False, None),  # V100, T4: emulated, slowly
    ("bf16", True, True, "bf16"),
    ("fp16", False, False, None),
    ("fp16", False, True, None),
    ("fp16", True, False, "fp16"),
    ("fp16", True, True, "fp16"),
    ("no", False, False, "no"),
    ("no", False, True, "no"),
    ("no", True, False, "no"),
    ("no", True, True, "no"),
]
GPU = dict(cuda_available=True, bf16_supported=True)


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize(("mixed_precision", "cuda", "bf16_ok", "expected"), PRECISION_TABLE)
def test_resolve_device_settings_picks_precision_device_and_backend(
    monkeypatch: pytest.MonkeyPatch, world_size: int, mixed_precision: str, cuda: bool, bf16_ok: bool,
    expected: str | None,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    if expected is None:
        with pytest.raises(ConfigError, match="--mixed_precision"):
            resolve_device_settings(mixed_precision, cuda_available=cuda, bf16_supported=bf16_ok)
        return
    settings = resolve_device_settings(mixed_precision, cuda_available=cuda, bf16_supported=bf16_ok)
    assert settings.precision == expected
    assert settings.use_cpu is (not cuda)
    assert settings.ddp_backend == (None if world_size == 1 else "nccl" if cuda else "gloo")


def test_rank_zero_prepares_data_before_every_other_rank_even_on_other_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Global, not per node: nodes sharing an HF cache would otherwise write the same files at once."""
    events = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "barrier", lambda: events.append("barrier"))
    for rank, local_rank in (("0", "0"), ("2", "0")):  # rank 2 is the first rank of the second node
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        with distributed.main_process_first():
            events.append(f"rank {rank} works")
    assert events == ["rank 0 works", "barrier", "barrier", "rank 2 works"]


def check_gradients_against(monkeypatch: pytest.MonkeyPatch, model: torch.nn.Module, other_rank) -> None:
    """assert_gradients_synchronised on rank 0 of 2, rank 1 sending other_rank(rank 0's gradient sums)."""
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)

    def all_gather(gathered: list, sums: torch.Tensor) -> None:
        gathered[0].copy_(sums)
        gathered[1].copy_(other_rank(sums.clone()))

    monkeypatch.setattr(distributed.dist, "all_gather", all_gather)
    distributed.assert_gradients_synchronised(model)


def test_gradients_ddp_left_unaveraged_are_named_with_the_parameter_that_had_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parameter without a gradient keeps DDP from all-reducing its bucket: the others in it then differ."""
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(2, 2), "skipped": torch.nn.Linear(2, 2)})
    model["used"](torch.ones(1, 2)).sum().backward()

    def unaveraged(sums: torch.Tensor) -> torch.Tensor:
        return sums + 1  # rank 1's own gradients, never averaged with rank 0's

    expected = ("gradients differ between rank 0 and rank 1 after the first step, in 2 parameter tensor(s) "
                "(used.weight, used.bias): DDP did not average them. 2 parameter tensor(s) (skipped.weight, "
                "skipped.bias) got no gradient on some rank: DDP all-reduces a bucket of gradients only once every "
                "parameter in it has one. A model whose forward skips parameters on some inputs needs "
                "--ddp_find_unused_parameters true")
    with pytest.raises(RuntimeError) as raised:
        check_gradients_against(monkeypatch, model, unaveraged)
    assert str(raised.value) == expected
    check_gradients_against(monkeypatch, model, lambda sums: sums)  # averaged: equal sums, NaN for none, pass
    # Without a missing gradient, the error names the other causes.
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(RuntimeError, match=r"in 1 parameter tensor\(s\) \(bias\): DDP did not average them\. Every "
                                           "parameter got a gradient, so DDP skipped no bucket"):
        check_gradients_against(monkeypatch, model, lambda sums: sums + torch.tensor([0.0, 1.0], dtype=sums.dtype))


@pytest.mark.parametrize(("mixed_precision", "options", "message"), [
    ("auto", dict(bf16=True, cuda_available=True, bf16_supported=False),
     r"^--mixed_precision bf16: this GPU has no native bf16 .* use --mixed_precision fp16 or auto$"),
    ("auto", dict(fp16=True, cuda_available=False),
     r"--mixed_precision fp16 needs a CUDA GPU.*--mixed_precision no"),
    ("fp16", dict(use_cpu=True, **GPU), "--mixed_precision fp16 needs a CUDA GPU"),  # --use_cpu on a GPU
    ("auto", dict(fp16=True, bf16=True, **GPU), "--fp16 and --bf16 are both set"),
    ("bf16", dict(fp16=True, **GPU), "--fp16 contradicts --mixed_precision bf16"),
    ("no", dict(fp16=True, **GPU), "--fp16 contradicts --mixed_precision no"),
    ("fp16", dict(bf16=True, **GPU), "--bf16 contradicts --mixed_precision fp16"),
], ids=["bf16-emulated", "fp16-cpu", "use-cpu", "fp16-and-bf16", "bf16-fp16", "no-fp16", "fp16-bf16"])
def test_impossible_or_contradictory_precision_settings_are_refused(
    mixed_precision: str, options: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_device_settings(mixed_precision, **options)


def test_a_precision_flag_use_cpu_and_a_ddp_backend_given_win_over_what_auto_would_pick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # auto would pick bf16 here; --fp16 given directly overrides it.
    assert resolve_device_settings("auto", fp16=True, **GPU).precision == "fp16"
    assert resolve_device_settings("fp16", fp16=True, **GPU).precision == "fp16"
    assert resolve_device_settings("auto", bf16=True, cuda_available=False).precision == "bf16"
    monkeypatch.setenv("WORLD_SIZE", "2")
    settings = resolve_device_settings("auto", use_cpu=True, **GPU)
    assert (settings.use_cpu, settings.ddp_backend, settings.precision) == (True, "gloo", "no")
    assert resolve_device_settings("auto", ddp_backend="gloo", **GPU).ddp_backend == "gloo"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert resolve_device_settings("no", ddp_backend="nccl", cuda_available=True).ddp_backend == "nccl"


@pytest.mark.parametrize("cpus, local_world_size, expected", [(2, "2", 0), (2, "1", 1), (16, "8", 1), (64, "8", 4),
                                                          (96, "1", 4)])
def test_loader_workers_default_to_this_process_share_of_the_cpus(
    monkeypatch: pytest.MonkeyPatch, cpus: int, local_world_size: str, expected: int
) -> None:
    monkeypatch.setattr(distributed.os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    assert distributed.default_dataloader_workers() == expected


def test_loader_workers_follow_the_machine_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    flags = [*REQUIRED, "--use_cpu", "true"]
    assert parse_args(flags)[2].dataloader_num_workers == 2
    assert parse_args([*flags, "--dataloader_num_workers", "0"])[2].dataloader_num_workers == 0
