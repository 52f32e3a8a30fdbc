"""What a benchmark row measures inside each training process, with the training code unchanged.

sitecustomize.py installs it in every torchrun worker when BENCH_PROBE_DIR is set. It uses hooks
torch offers for this, and writes BENCH_PROBE_DIR/rank<RANK>.json when the process exits:

- a global optimizer-step post-hook: the wall-clock time (time.time()) of the first and the last
  optimizer step, and how many there were;
- a global module forward pre-hook that waits for the first train-mode call of a
  `*ForSequenceClassification` module (the model being trained), notes the time, and hands over to
  a forward hook on that module alone (so no other module runs a hook). For each train-mode
  forward it counts the examples, the processed tokens (input_ids.numel(), padding included), the
  real tokens (the attention mask's sum) and the squared real lengths (attention FLOPs grow with
  them). Eval forwards are not counted;
- the CPU time the process used in the window (time.process_time()), which other work on the
  machine changes less than wall time;
- after the first optimizer step, the bytes this rank holds in the model's parameters, their gradients
  and the optimizer's state tensors: under FSDP its shards (DTensor.to_local()), under DDP every
  tensor whole;
- at exit: the process's peak resident set size (getrusage's ru_maxrss, in KiB on Linux).

The counted window runs from the first train forward, or with BENCH_PROBE_WARMUP_STEPS=N from the
end of optimizer step N, to the last optimizer step. On CUDA the counters stay on the GPU (no
synchronisation per step) and CUDA events also time the window on the GPU's own clock.

With BENCH_PROBE_PROFILE_STEPS=K, torch.profiler also records the window's first K optimizer steps
(a run of its own: the profiler slows the host down) and the record gains "profile", per step:
the wall and CPU milliseconds, the GPU's busy milliseconds (the union of its kernels' and copies'
intervals) and its idle share, the kernel launches, the CUDA calls that wait for the GPU (stream,
event and device synchronisation, blocking copies) and the reads of one number back to the host
(`aten::_local_scalar_dense`, what `Tensor.item()` runs; on a GPU each waits for it).
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook

MODEL_SUFFIX = "ForSequenceClassification"
KERNEL_LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                   "cudaGraphLaunch"}
# The CUDA runtime calls that block the host until the GPU catches up (cudaMemcpy: the synchronous copy).
HOST_SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
READ_BACK = "aten::_local_scalar_dense"


class Probe:
    def __init__(self, out_dir: str, rank: int, warmup_steps: int, profile_steps: int = 0) -> None:
        self.path = Path(out_dir) / f"rank{rank}.json"
        self.rank, self.warmup_steps = rank, warmup_steps
        self.first_forward = self.first_step = self.window_start = self.last_step = None
        self.window_cpu_start = self.last_step_cpu = None  # time.process_time(): CPU seconds of this process
        self.steps = 0
        self.counting = False
        self.samples = self.processed_tokens = 0
        self.real: torch.Tensor | None = None  # [real tokens, sum of squared real lengths], on the model's device
        self.on_gpu = False
        self.model: torch.nn.Module | None = None
        self.state_bytes: dict[str, int] | None = None
        self.start_event = self.end_event = None
        self.profile_steps, self.profiler, self.profile = profile_steps, None, None
        self.finder = register_module_forward_pre_hook(self.find_model)
        register_optimizer_step_post_hook(self.after_step)
        atexit.register(self.write)

    def open_window(self) -> None:
        self.window_start, self.window_cpu_start, self.counting = time.time(), time.process_time(), True
        if self.on_gpu:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()
        if self.profile_steps:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.on_gpu:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.__enter__()
            self.profile_start = (self.steps, time.perf_counter(), time.process_time())

    def find_model(self, module: torch.nn.Module, args: tuple) -> None:
        if not (module.training and type(module).__name__.endswith(MODEL_SUFFIX)):
            return
        self.finder.remove()
        self.model, self.first_forward = module, time.time()
        self.on_gpu = next(module.parameters()).is_cuda
        if self.warmup_steps == 0:
            self.open_window()
        # A forward hook, not a pre-hook: this call's pre-hooks are already chosen, its hooks are not.
        module.register_forward_hook(self.count, with_kwargs=True)

    def count(self, module: torch.nn.Module, args: tuple, kwargs: dict, output) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if not (self.counting and module.training) or input_ids is None:
            return
        mask = kwargs.get("attention_mask")
        if mask is None:
            lengths = torch.full(input_ids.shape[:1], input_ids.shape[1], device=input_ids.device)
        else:
            lengths = mask.sum(dim=1, dtype=torch.int64)
        self.samples += input_ids.shape[0]
        self.processed_tokens += input_ids.numel()
        real = torch.stack([lengths.sum(), (lengths * lengths).sum()])
        self.real = real if self.real is None else self.real + real

    def after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self.last_step, self.last_step_cpu = time.time(), time.process_time()
        if self.first_step is None:
            self.first_step = self.last_step
        self.steps += 1
        if self.steps == 1 and self.model is not None:
            self.state_bytes = held_bytes(self.model, optimizer)
        if self.steps == self.warmup_steps:
            self.open_window()
        elif self.on_gpu and self.counting:
            self.end_event = torch.cuda.Event(enable_timing=True)
            self.end_event.record()
        if self.profiler is not None and self.steps - self.profile_start[0] == self.profile_steps:
            self.end_profile()

    def end_profile(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize()  # the steps' kernels end inside the profile
        wall, cpu = time.perf_counter() - self.profile_start[1], time.process_time() - self.profile_start[2]
        self.profiler.__exit__(None, None, None)
        events, self.profiler = self.profiler.events(), None
        busy = union_length(sorted((event.time_range.start, event.time_range.end) for event in events
                                    if event.device_type == DeviceType.CUDA)) / 1e6  # microseconds
        steps = self.profile_steps

        def per_step(names: set[str]) -> float:
            return round(sum(event.name in names for event in events) / steps, 1)

        self.profile = {
            "steps": steps, "wall_ms": round(1000 * wall / steps, 2), "cpu_ms": round(1000 * cpu / steps, 2),
            "gpu_busy_ms": round(1000 * busy / steps, 2) if self.on_gpu else None,
            "gpu_idle_share": round(1 - busy / wall, 3) if self.on_gpu else None,
            "kernel_launches": per_step(KERNEL_LAUNCHES) if self.on_gpu else None,
            "host_syncs": per_step(HOST_SYNCS) if self.on_gpu else None,
            "reads_back": per_step({READ_BACK}),
        }

    def write(self) -> None:
        if self.profiler is not None:  # the run ended inside the profiled steps
            self.profile_steps = self.steps - self.profile_start[0]
            if self.profile_steps:
                self.end_profile()
        real_tokens, squared_lengths = self.real.tolist() if self.real is not None else (0, 0)
        gpu_window_seconds = None
        if self.start_event is not None and self.end_event is not None:
            self.end_event.synchronize()
            gpu_window_seconds = self.start_event.elapsed_time(self.end_event) / 1000
        record = {
            "rank": self.rank, "first_forward": self.first_forward, "first_step": self.first_step,
            "window_start": self.window_start, "last_step": self.last_step, "steps": self.steps,
            "warmup_steps": self.warmup_steps, "samples": self.samples, "processed_tokens": self.processed_tokens,
            "real_tokens": real_tokens, "squared_lengths": squared_lengths, "gpu_window_seconds": gpu_window_seconds,
            "window_cpu_seconds": None if self.window_cpu_start is None else self.last_step_cpu - self.window_cpu_start,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "state_bytes": self.state_bytes, "profile": self.profile,
        }
        self.path.write_text(json.dumps(record) + "\n")


def install_in_forked_ranks(out_dir: str) -> None:
    """In a launcher that forks its workers: each forked process that runs a forward with RANK set installs
    the probe then, and counts from that forward on."""
    def install_on_first_forward(module: torch.nn.Module, args: tuple) -> None:
        if "RANK" in os.environ and os.getpid() not in installed:
            installed[os.getpid()] = install(out_dir, int(os.environ["RANK"]))
            hook.remove()
            installed[os.getpid()].find_model(module, args)

    installed: dict[int, Probe] = {}
    hook = register_module_forward_pre_hook(install_on_first_forward)


def union_length(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of sorted (start, end) intervals: work on several GPU streams counts once."""
    total, reach = 0.0, float("-inf")
    for start, end in intervals:
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def local_bytes(tensor: torch.Tensor) -> int:
    """The bytes of this rank's part of a tensor: its shard if it is a DTensor (FSDP), else all of it."""
    tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return tensor.numel() * tensor.element_size()


def held_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters (frozen ones too), gradients and optimizer state, as this rank holds them."""
    parameters = list(model.parameters())
    return {
        "parameters": sum(local_bytes(p) for p in parameters),
        "gradients": sum(local_bytes(p.grad) for p in parameters if p.grad is not None),
        "optimizer": sum(local_bytes(value) for state in optimizer.state.values() for value in state.values()
                         if isinstance(value, torch.Tensor)),
    }


def install(out_dir: str, rank: int) -> Probe:
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return Probe(out_dir, rank, int(os.environ.get("BENCH_PROBE_WARMUP_STEPS", "0")),
                 int(os.environ.get("BENCH_PROBE_PROFILE_STEPS", "0")))
