"""A bad setting given to a launch script ends with one `error:` line before any worker starts. The first
case runs scripts/train_single_node.sh for real (2 processes asked for), as a user would: its launcher
(torchrun.py) runs the preflight before it forks the workers. The others run the same check alone,
`python -m <package>.preflight` for 2 processes (tests/conftest.py's run_python). A good run passing the
preflight is in tests/test_launch_end_to_end.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import PACKAGE, REPO_ROOT, finish, run_env, run_python, smoke_flags, start

pytestmark = pytest.mark.slow  # real launches: `make test-all`

SCRIPT = REPO_ROOT / "scripts" / "train_single_node.sh"


def launch(flags: list[str]) -> subprocess.CompletedProcess:
    return finish(start([str(SCRIPT), *flags], run_env(NPROC_PER_NODE="2")), timeout=180)


def preflight(flags: list[str]) -> subprocess.CompletedProcess:
    """The check the script's launcher runs first, for 2 processes."""
    return run_python(["-m", f"{PACKAGE}.preflight", *flags], timeout=180, env=run_env(PREFLIGHT_WORLD_SIZE="2"))


def write_csv(path: Path, labels: list[str]) -> Path:
    path.write_text("text,label\n" + "".join(f"review number {i},{label}\n" for i, label in enumerate(labels)))
    return path


def with_flag(flags: list[str], name: str, value: str) -> list[str]:
    if name in flags:
        flags = list(flags)
        flags[flags.index(name) + 1] = value
        return flags
    return [*flags, name, value]


# (case id, how to break smoke flags, text the one error line holds)
BAD_SETTINGS = [
    ("flag value", lambda flags, tmp: [*flags, "--learning_rate", "fast"], "invalid float value: 'fast'"),
    ("unknown flag", lambda flags, tmp: [*flags, "--lerning_rate", "1e-3"], "unrecognized arguments: --lerning_rate"),
    ("range", lambda flags, tmp: [*flags, "--max_seq_length", "0"], "--max_seq_length 0: must be >= 1"),
    ("missing file", lambda flags, tmp: with_flag(flags, "--train_file", str(tmp / "nope.csv")),
     "--train_file '{tmp}/nope.csv' not found"),
    ("missing column", lambda flags, tmp: [*flags, "--text_column", "body"],
     "--text_column 'body' is not a column of the train split; columns are: text, label"),
    ("two data sources", lambda flags, tmp: [*flags, "--dataset_name", "imdb"], "--dataset_name imdb and --train_file"),
    ("batch larger than the data", lambda flags, tmp: [*flags, "--per_device_train_batch_size", "200"],
     "one optimizer step takes 400 examples (2 process(es) x --per_device_train_batch_size 200"),
    ("labels the model has no head for",
     lambda flags, tmp: with_flag(with_flag(flags, "--train_file", str(write_csv(tmp / "three.csv", list("abcabc")))),
                                  "--validation_file", str(tmp / "three.csv")),
     "has a classifier for 2 labels, the data needs 3 (a, b, c): pass --ignore_mismatched_sizes true"),
    ("missing model", lambda flags, tmp: with_flag(flags, "--model_name_or_path", str(tmp / "no-model")),
     "could not be loaded (no such folder)"),
]


@pytest.mark.parametrize("case, breaks, expected", BAD_SETTINGS, ids=[case for case, _, _ in BAD_SETTINGS])
def test_a_bad_setting_is_one_error_line_before_any_worker_starts(
    smoke_assets: Path, tmp_path: Path, case: str, breaks, expected: str
) -> None:
    output_dir = tmp_path / "out"
    flags = breaks(smoke_flags(smoke_assets, output_dir), tmp_path)
    result = launch(flags) if case == BAD_SETTINGS[0][0] else preflight(flags)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, result.stderr
    assert expected.format(tmp=tmp_path) in error_lines[0]
    assert result.stderr.strip().splitlines()[-1] == error_lines[0]  # the last word is the error
    assert "world size" not in result.stdout + result.stderr, "a worker was started"
    assert "Traceback" not in result.stdout + result.stderr
    assert not output_dir.exists()


def test_a_checkpoint_in_output_dir_of_other_labels_or_a_split_this_launch_cannot_resume_is_refused_before_launch(
    smoke_assets: Path, tmp_path: Path
) -> None:
    output_dir = tmp_path / "out"
    trained = run_python(["-m", f"{PACKAGE}.train", *smoke_flags(smoke_assets, output_dir), "--max_steps", "2"])
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = f"{output_dir}/checkpoint-2"  # 1 process x batch 16
    own_data = str(write_csv(tmp_path / "own.csv", ["bad", "good", "so-so"] * 6))  # a step of 16 fits
    flags = with_flag(with_flag(smoke_flags(smoke_assets, output_dir), "--train_file", own_data),
                      "--validation_file", own_data)
    result = preflight([*flags, "--ignore_mismatched_sizes", "true"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: checkpoint '{checkpoint}' was trained for labels ['negative', 'positive'], but the data "
        "has labels ['bad', 'good', 'so-so']: use a new --output_dir for this data (or pass the checkpoint's data)"
    ]
    worker = run_python(["-m", f"{PACKAGE}.train", *flags, "--ignore_mismatched_sizes", "true"])  # PREFLIGHT=0
    assert worker.returncode == 2 and "labels ['bad', 'good', 'so-so']" in worker.stderr.strip().splitlines()[-1]
    # The same job on 2 processes, as after a requeue onto more nodes: batch 16 each cannot keep the global
    # batch of 16; batch 8 each can.
    result = preflight(smoke_flags(smoke_assets, output_dir))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the checkpoint's global batch of 16 (1 processes x 16 x 1 accumulation steps) cannot be made "
        "from --per_device_train_batch_size 16 on 2 processes; pick a batch size that, times 2, divides 16")
    resumable = preflight([*smoke_flags(smoke_assets, output_dir), "--per_device_train_batch_size", "8"])
    assert resumable.returncode == 0, resumable.stderr[-2000:]
    assert "resuming a run of 1 processes on 2: 1 accumulation steps keep its global batch of 16" in resumable.stdout


@pytest.mark.parametrize(("flags", "line"), [(["--text_column", "body"], "error: --text_column 'body' is not a column"),
                                             (["--lerning_rate", "3"], "error: unrecognized arguments: --lerning")])
def test_an_error_found_in_the_workers_is_printed_once(smoke_assets: Path, tmp_path: Path, flags, line) -> None:
    # Without the preflight both workers meet the bad setting themselves: the launcher exits 2 without its
    # ChildFailedError report (torchrun's agent still logs how the worker ended).
    result = finish(start([str(SCRIPT), *smoke_flags(smoke_assets, tmp_path), *flags],
                          run_env(NPROC_PER_NODE="2", PREFLIGHT="0")), timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "ChildFailedError" not in output, output[-3000:]
    assert output.count(line) == 1, output[-3000:]
