"""The native loop's running loss: summed on the device, read back only when a line is logged."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class LossMeter:
    """Sums losses on the device, as reading one back at every step (.item()) would make the CPU wait for
    the GPU each time; flush() averages them over steps and ranks with one all_reduce."""

    def __init__(self, device: torch.device, step: int) -> None:
        self.window = torch.zeros(2, device=device)  # loss sum, examples, since the last flush
        self.step, self.start_time, self.samples = step, time.perf_counter(), 0

    def add(self, loss: torch.Tensor, samples: int) -> None:
        self.window[0] += loss.detach().float()
        self.window[1] += samples

    def flush(self, step: int) -> dict[str, float]:
        """The mean loss per step since the last flush, over every rank (a collective: call it on all)."""
        if dist.is_initialized():
            dist.all_reduce(self.window)
        (loss_sum, samples), steps = self.window.tolist(), step - self.step
        mean_loss = loss_sum / (dist.get_world_size() if dist.is_initialized() else 1) / steps
        self.samples += int(samples)
        self.window.zero_()
        self.step = step
        return {"loss": round(mean_loss, 4)}

    def trained(self) -> tuple[float, int]:
        """Seconds since this meter started, and examples (over all ranks) up to the last flush."""
        return time.perf_counter() - self.start_time, self.samples
