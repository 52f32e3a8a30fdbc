"""More of the DDP proof (tests/test_ddp.py in the render): resuming from a named checkpoint, the gradient
check, evaluation or training alone, and ranks that refuse together. Two torchrun processes on gloo, or one
plain process."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import EVAL_SIZE, PACKAGE, REPO_ROOT, SMOKE, TRAIN_SIZE, read_probe, smoke_flags
from warm_launch import run_python, torchrun

pytestmark = pytest.mark.slow  # real launches

PROBE = str(REPO_ROOT / "tests" / "ddp_probe.py")
STEPS_PER_EPOCH = TRAIN_SIZE // (2 * SMOKE["per_device_train_batch_size"])  # 2 ranks
EPOCHS = SMOKE["num_train_epochs"]


@pytest.fixture(scope="module")
def first_run(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    output_dir = tmp_path_factory.mktemp("ddp_run")
    torchrun([PROBE, *smoke_flags(smoke_assets, output_dir)])
    return {"output_dir": output_dir, "kept_checkpoint": output_dir / f"checkpoint-{(EPOCHS - 1) * STEPS_PER_EPOCH}"}


def test_resume_from_an_explicit_checkpoint(first_run: dict, smoke_assets: Path, tmp_path: Path) -> None:
    checkpoint = first_run["kept_checkpoint"]
    flags = [*smoke_flags(smoke_assets, tmp_path), "--resume_from_checkpoint", str(checkpoint)]
    torchrun([PROBE, *flags])
    records = read_probe(tmp_path)
    assert [record["resumed_from"] for record in records] == [str(checkpoint)] * 2
    assert [record["steps_run"] for record in records] == [STEPS_PER_EPOCH] * 2


GRADIENT_CHECK_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import torch
    import torch.distributed as dist
    from {package}.distributed import assert_gradients_synchronised

    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 2)
    if mode == "synced":
        model = torch.nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(dist.get_rank())  # each rank sees different data
    model(torch.randn(8, 4)).sum().backward()
    try:
        assert_gradients_synchronised(model)
        outcome = "in sync"
    except RuntimeError as err:
        outcome = "refused: " + str(err)
    (out_dir / ("rank%d.txt" % dist.get_rank())).write_text(outcome)
    """
)


@pytest.mark.parametrize("mode, expected", [("synced", "in sync"), ("unsynced", "refused: gradients differ")])
def test_gradient_sync_check_refuses_ranks_that_do_not_share_gradients(
    tmp_path: Path, mode: str, expected: str
) -> None:
    script = tmp_path / "check.py"
    script.write_text(GRADIENT_CHECK_SCRIPT.replace("{package}", PACKAGE))
    # check=False: the outcome files are the result. With torch 2.13 a gloo process sometimes
    # aborts at interpreter exit ("terminate called without an active exception") after its work.
    torchrun([str(script), mode, str(tmp_path)], check=False)
    outcomes = [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]
    assert all(outcome.startswith(expected) for outcome in outcomes), outcomes


def run_single_process(flags: list[str]) -> subprocess.CompletedProcess:
    """Plain `python -m <package>.train`, one process, no torchrun."""
    return run_python(["-m", f"{PACKAGE}.train", *flags])


def test_do_eval_false_trains_without_evaluating(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path), "--max_steps", "2", "--do_eval", "false"])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert "train_loss" in metrics and not [key for key in metrics if key.startswith("eval_")]


def test_do_train_false_only_evaluates_the_loaded_model(first_run: dict, smoke_assets: Path, tmp_path: Path) -> None:
    flags = smoke_flags(smoke_assets, tmp_path)
    flags[flags.index("--model_name_or_path") + 1] = str(first_run["output_dir"])  # the trained model
    result = run_single_process([*flags, "--do_train", "false"])
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    trained = json.loads((first_run["output_dir"] / "metrics.json").read_text())
    assert "train_loss" not in metrics and metrics["eval_num_examples"] == EVAL_SIZE
    assert metrics["eval_accuracy"] == trained["eval_accuracy"]
    assert not list(tmp_path.glob("checkpoint-*")), "it trained anyway"


def test_nothing_to_do_is_refused(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path), "--do_train", "false", "--do_eval", "false"])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --do_train false and --do_eval false leave nothing to do; keep at least one")


def test_a_mistyped_resume_path_is_named_as_missing(smoke_assets: Path, tmp_path: Path) -> None:
    missing = tmp_path / "checkpoint-7"
    result = run_single_process([*smoke_flags(smoke_assets, tmp_path / "out"),
                                 "--resume_from_checkpoint", str(missing)])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: --resume_from_checkpoint '{missing}' does not exist"


AGREE_SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    from pathlib import Path

    import torch.distributed as dist
    from {package}.config import ConfigError
    from {package}.distributed import agree_on_precision
    from {package} import resume

    what, out_dir = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    try:
        if what == "precision":  # rank 1 stands for a GPU without native bf16, next to one with it
            agree_on_precision("bf16" if rank == 0 else "fp16")
        else:  # rank 1 stands for a node that cannot see the checkpoint (output_dir not shared)
            if rank == 1:
                resume.checkpoint_problem = lambda path, last_file: "does not exist"
            resume.agree_on_resume_checkpoint(what, str(out_dir), "complete")
        outcome = "went on"
    except ConfigError as err:
        outcome = "error: " + str(err)
    (out_dir / ("rank%d.txt" % dist.get_rank())).write_text(outcome)
    dist.destroy_process_group()
    """
)


def agree(tmp_path: Path, what: str) -> list[str]:
    """Each rank's outcome of the agreement script; fast, though the group's timeout is 600 s."""
    script = tmp_path / "agree.py"
    script.write_text(AGREE_SCRIPT.replace("{package}", PACKAGE))
    started = time.monotonic()
    torchrun([str(script), what, str(tmp_path)], timeout=120)
    assert time.monotonic() - started < 60
    return [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)]


def test_a_checkpoint_one_rank_cannot_read_fails_every_rank_at_once(tmp_path: Path) -> None:
    """Not only the rank that cannot read it: the others would wait in their next collective until timeout."""
    expected = (f"error: checkpoint '{tmp_path / 'checkpoint-4'}' is on rank 0 but rank(s) 1 cannot read it "
                "(does not exist): with several nodes, --output_dir must be on a filesystem every node shares")
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "complete").write_text("{}")  # what the loop writes last
    assert agree(tmp_path, str(tmp_path / "checkpoint-4")) == [expected, expected]


def test_ranks_that_chose_different_precisions_refuse_together(tmp_path: Path) -> None:
    expected = ("error: the ranks chose different precisions (rank 0: bf16, rank 1: fp16), as on a cluster mixing "
                "GPU types; pass --mixed_precision fp16 (or no) so that every rank trains alike")
    assert agree(tmp_path, "precision") == [expected, expected]
