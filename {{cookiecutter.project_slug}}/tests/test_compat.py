"""The private APIs compat.py wraps, still as they were when it was checked: after an upgrade, a failure here
names the one that changed and the versions (compat.CHECKED_ON) on which it did what the project expects."""

from __future__ import annotations

import inspect
import multiprocessing
import subprocess
import sys

#% if cookiecutter.training_loop == "trainer"
import pytest
#% endif
import torch
#% if cookiecutter.training_loop == "trainer"
import transformers
#% endif
from conftest import PACKAGE, package_module, run_env
from torch.utils.data import DataLoader
from transformers import AutoModel

compat = package_module("compat")


def changed(api: str, how: str) -> str:
    return f"{api} {how}; compat.py was checked on {compat.CHECKED_ON}: port it there, or install those versions"


#% if cookiecutter.training_loop == "native"
def test_grad_scaler_gives_the_scale_and_setting_last_epoch_back_sets_a_schedule_back() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones(()))  # sets the scale up
    assert hasattr(scaler, "_get_scale_async"), changed("GradScaler._get_scale_async", "is gone")
    params = tuple(inspect.signature(torch.amp.GradScaler._get_scale_async).parameters)
    assert params == ("self",), changed("GradScaler._get_scale_async", f"takes {params}")
    assert torch.equal(scaler._get_scale_async(), torch.tensor(8.0)), changed("GradScaler._get_scale_async",
                                                                             "no longer returns the scale")
    assert torch.equal(compat.loss_scale(scaler), torch.tensor(8.0))
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step)  # the rate is the step count
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    compat.take_back_skipped_steps(scheduler, torch.tensor(1))  # of those 3 steps, 1 skipped
    assert (scheduler.last_epoch, scheduler.get_last_lr()) == (2, [2.0]), changed(
        "LRScheduler.last_epoch", "no longer sets the schedule back")


#% else
@pytest.mark.parametrize("name", compat.TRAINER_OVERRIDES)
def test_the_trainer_has_each_private_method_train_py_overrides_with_its_parameters(name: str) -> None:
    method = getattr(transformers.Trainer, name, None)
    assert callable(method), changed(f"Trainer.{name}", "is gone")
    params = tuple(inspect.signature(method).parameters)
    assert params == compat.TRAINER_OVERRIDES[name], changed(f"Trainer.{name}", f"takes {params}")


def test_accelerates_loader_wraps_the_dataloader_that_starts_its_workers() -> None:
    from accelerate.data_loader import DataLoaderShard

    shard = DataLoaderShard(range(4), batch_size=2)
    assert type(compat.base_dataloader(shard)) is DataLoader, changed("accelerate's DataLoaderShard.base_dataloader",
                                                                      "is gone")


#% endif
def test_atexit_clear_and_run_exitfuncs_forget_and_run_the_exit_handlers() -> None:
    # In a new process: clearing this one's handlers would drop pytest's.
    child = (f"import atexit\nfrom {PACKAGE} import compat\natexit.register(print, 'cleared')\n"
             "compat.clear_exit_handlers()\natexit.register(print, 'ran')\ncompat.run_exit_handlers()\n")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=run_env(), timeout=60)
    assert (done.returncode, done.stdout) == (0, "ran\n"), changed(
        "atexit._clear or atexit._run_exitfuncs", f"no longer clears, or runs once, the exit handlers: {done}")


def test_attention_implementation_names_the_kernel_a_model_runs(smoke_assets) -> None:
    for kernel in ("eager", "sdpa"):
        model = AutoModel.from_pretrained(smoke_assets / "tiny-bert", attn_implementation=kernel)
        assert compat.attention_implementation(model) == kernel, changed("PreTrainedConfig._attn_implementation",
                                                                         f"does not say {kernel}")


def test_compile_counts_counts_the_graphs_and_recompiles_of_torch_compile() -> None:
    before = compat.compile_counts()
    double = torch.compile(lambda x: (x * 2).sum(), backend="aot_eager")  # as inductor, less its code
    for shape in [(2,), (2,), (3, 2)]:  # the third compiles again: its guards refuse another rank
        double(torch.ones(shape, requires_grad=True)).backward()  # a backward is recorded apart, uncounted
    after = compat.compile_counts()
    assert {key: after[key] - before[key] for key in after} == {"compiled_graphs": 2, "recompiles": 1}, changed(
        "torch._dynamo.utils.get_compilation_metrics", f"counted {before}, then {after}")


def test_the_dataloader_starts_its_workers_from_the_module_compat_looks_for() -> None:
    seen = []

    class RecordingContext(multiprocessing.context.ForkContext):
        def Process(self, *args, **kwargs):  # the loader iterator starts each worker with it
            seen.append(compat.forking_loader_workers())
            return super().Process(*args, **kwargs)

    loader = DataLoader(range(2), num_workers=1, multiprocessing_context=RecordingContext())
    assert [batch.tolist() for batch in loader] == [[0], [1]]
    assert seen == [True], changed(f"torch's _MultiProcessingDataLoaderIter in {compat.LOADER_MODULE}",
                                   "no longer starts the loader workers from there")
    assert not compat.forking_loader_workers()
