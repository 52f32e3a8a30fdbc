"""The preflight and the training worker accept and refuse the same settings, with the same words. Each case
runs `python -m <package>.preflight` and `python -m <package>.train` in this process, one process and no
torchrun (test_preflight.py covers 2 processes through the launch script)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import package_module, smoke_flags

# (case, flags, None if accepted or the error line both must print)
CASES = [
    ("defaults", [], None),
    ("train batch 0", ["--per_device_train_batch_size", "0"], "--per_device_train_batch_size 0: must be >= 1"),
    ("eval batch 0", ["--per_device_eval_batch_size", "0"], "--per_device_eval_batch_size 0: must be >= 1"),
    ("accumulation 0", ["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps 0: must be >= 1"),
    ("one step fits the data", ["--max_train_samples", "32", "--gradient_accumulation_steps", "2"], None),
    ("accumulation makes a step larger than the data",
     ["--max_train_samples", "24", "--gradient_accumulation_steps", "2"],
     "one optimizer step takes 32 examples (1 process(es) x --per_device_train_batch_size 16 x "
     "--gradient_accumulation_steps 2), more than the 24 train examples"),
    ("no epochs", ["--num_train_epochs", "0", "--max_steps", "-1"], "--num_train_epochs 0.0 trains nothing"),
    ("fractional steps above 1", ["--logging_steps", "2.5"],
     "--logging_steps 2.5: use a whole number of steps, or a fraction of the run below 1"),
    ("negative warmup", ["--warmup_steps", "-1"], "--warmup_steps -1.0: must be >= 0"),
    ("a schedule without the setting it needs", ["--lr_scheduler_type", "cosine_with_min_lr"],
     "--lr_scheduler_type cosine_with_min_lr, --lr_scheduler_kwargs {}: One of min_lr or min_lr_rate"),
    ("and with it", ["--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", '{"min_lr": 0}'], None),
    ("fp16 on CPU", ["--mixed_precision", "fp16"], "--mixed_precision fp16 needs a CUDA GPU"),
    ("nccl on CPU", ["--ddp_backend", "nccl"], "--ddp_backend nccl needs CUDA GPUs (and no --use_cpu)"),
    ("fp16 and bf16", ["--fp16", "true", "--bf16", "true"], "--fp16 and --bf16 are both set"),
]


@pytest.fixture(autouse=True)
def one_process(isolated_process, datasets_cache_in_tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("PREFLIGHT_WORLD_SIZE", "1")


def verdict(module: str, argv: list[str], capsys: pytest.CaptureFixture) -> str | None:
    """None if the module ran through; else its one error line, without the `error: ` prefix."""
    capsys.readouterr()
    try:
        package_module(module).main(argv)
    except SystemExit as exit_:
        assert exit_.code == 2, f"{module} exited {exit_.code}"
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        return lines[0].removeprefix("error: ")
    return None


@pytest.mark.parametrize(("flags", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_the_preflight_and_the_worker_give_the_same_verdict(
    smoke_assets: Path, tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], expected: str | None
) -> None:
    argv = [*smoke_flags(smoke_assets, tmp_path / "out"), "--max_steps", "1", "--do_eval", "false",
            "--save_strategy", "no", "--dataloader_num_workers", "0", *flags]
    preflight, worker = verdict("preflight", argv, capsys), verdict("train", argv, capsys)
    if expected is None:
        assert preflight is None and worker is None
        assert (tmp_path / "out" / "model.safetensors").is_file(), "the accepted run trained and saved"
    else:
        assert preflight is not None and preflight.startswith(expected)
        assert worker == preflight
