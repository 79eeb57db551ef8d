"""Timing and memory: the timer, paired ratios of interleaved rounds, glibc's allocator, peak memory."""
import contextlib
import ctypes
import random
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def synchronize(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Seconds per step (``times``), the device synchronised around each, and each step's start
    (``started``); on CUDA with ``reset_peak``, the peak memory counted from the timer's making."""

    def __init__(self, device, reset_peak: bool = True):
        self.device, self.times, self.started = torch.device(device), [], []
        if reset_peak and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def start(self) -> None:
        synchronize(self.device)
        self.started.append(time.perf_counter())

    def stop(self) -> float:
        synchronize(self.device)
        self.times.append(time.perf_counter() - self.started[-1])
        return self.times[-1]

    @contextlib.contextmanager
    def step(self):
        self.start()
        yield
        self.stop()

    def summary(self, warmup: int) -> dict:
        """The median s/iter after ``warmup`` steps (of all if none is left), every time, CUDA peak GB."""
        timed = self.times[warmup:] or self.times
        out = dict(s_per_iter=statistics.median(timed), times_s=self.times, warmup_steps=warmup)
        if self.device.type == "cuda":
            out["peak_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 1e9
        return out


def train_step(loss: torch.Tensor, optimizer) -> None:
    """The end of a timed training step: backward, the optimizer's step, gradients dropped."""
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def paired_ratios(times_a, times_b) -> dict:
    """Time ratio a/b from per-round ratios: their median, bootstrap 95% interval (``ci95``) and range."""
    ratios = [ta / tb for ta, tb in zip(times_a, times_b)]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return dict(time_ratios=ratios, median=statistics.median(ratios), ci95=(medians[49], medians[1949]),
                min=min(ratios), max=max(ratios))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors, flattened, in float64."""
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def keep_freed_memory():
    """Make glibc malloc keep freed memory instead of unmapping it, so that a step does not fault its
    activations in again (docs/performance.md). Returns the settings made, or None where the C
    library is not glibc (nothing changes)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    settings = {"M_MMAP_THRESHOLD": (-3, 32 * 2 ** 20), "M_TRIM_THRESHOLD": (-1, 2 ** 31 - 1)}
    if not all(mallopt(param, value) == 1 for param, value in settings.values()):
        return None
    return {name: value for name, (_, value) in settings.items()}


def minor_page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def peak_rss_mib() -> float:
    """This process's peak resident set in MiB: VmHWM (ru_maxrss survives exec: a parent's peak)."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2 ** 20 if sys.platform == "darwin" else 1024)
