"""Between logging steps, a training step reads nothing back to the host but what transformers reads.

On a GPU, reading a tensor's value on the host (`.item()`, `bool(tensor)`, `.tolist()`, all of which run
`aten::_local_scalar_dense`) waits for every kernel queued before it: the GPU then idles while the host
queues the next ones. Each loop trains 8 optimizer steps of the smoke model in one process, logging only
at the end, and every read of steps 3 to 7 is counted by the Python line that made it. The one allowed:
transformers' check that an SDPA mask has no padding (masking_utils, once a forward), which eager mode
cannot skip. Reads below Python (inside one operator, as CPU AdamW reads its step counts) are not seen;
nor is anything only a GPU shows: bench/gpu_check.sh profiles that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, run_env, smoke_flags

pytestmark = pytest.mark.slow  # a real run: `make test-all`

COUNT_READS = """
import collections, json, pathlib, runpy, sys, traceback
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode

steps, reads = [0], collections.Counter()
register_optimizer_step_post_hook(lambda *args: steps.__setitem__(0, steps[0] + 1))


class CountReads(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default and 2 <= steps[0] < 7:
            caller = [frame for frame in traceback.extract_stack()[:-1] if "/torch/" not in frame.filename][-1]
            reads[f"{caller.filename.rsplit('site-packages/', 1)[-1]}:{caller.lineno}"] += 1
        return func(*args, **(kwargs or {}))


out, package = sys.argv[1:3]  # python -c COUNT_READS OUT PACKAGE FLAGS...
sys.argv = ["train", *sys.argv[3:]]
with CountReads():
    runpy.run_module(package + ".train", run_name="__main__")
pathlib.Path(out).write_text(json.dumps(reads))
"""


def test_a_step_between_logging_steps_reads_back_only_transformers_mask_check(smoke_assets: Path,
                                                                              tmp_path: Path) -> None:
    flags = [*smoke_flags(smoke_assets, tmp_path / "output"), "--max_steps", "8", "--logging_steps", "100",
             "--do_eval", "false", "--save_strategy", "no", "--dataloader_num_workers", "0"]
    out = tmp_path / "reads.json"
    result = subprocess.run([sys.executable, "-c", COUNT_READS, str(out), PACKAGE, *flags], env=run_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    reads = json.loads(out.read_text())
    others = {line: count for line, count in reads.items() if not line.startswith("transformers/masking_utils.py")}
    assert others == {}, f"reads back per 5 steps, by the line that made them: {others}"
    assert sum(reads.values()) == 5  # the mask check: one forward a step (no accumulation in smoke.yaml)
