"""Timing and memory: the timer every measurement uses, the paired ratios of interleaved
rounds, glibc's allocator settings and the process's own peak memory."""
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
    """Seconds per step, the device synchronised around each, with each step's start time;
    and (CUDA, ``reset_peak``) the peak memory allocated since the timer was made."""

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
        """The median of the steps after ``warmup`` (all of them if there are no more), every
        step's time, and on CUDA the peak memory in GB."""
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
    """Time ratio a/b from per-round ratios (the same round: measured seconds apart): their
    median with a bootstrap 95% interval, and their range."""
    ratios = [ta / tb for ta, tb in zip(times_a, times_b)]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return dict(time_ratios=ratios, median=statistics.median(ratios), ci95=(medians[49], medians[1949]),
                min=min(ratios), max=max(ratios))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two tensors, flattened, in float64."""
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def keep_freed_memory():
    """Make glibc malloc keep freed memory for reuse instead of returning it to the kernel.

    By default glibc serves the large activation buffers with mmap (or trims the heap) and
    unmaps them on free, so a step can fault its activations in again: on the 2-vCPU CI VM a
    plain inference loop over the depth-32 ViT (224px, batch 8) took ~50k page faults and
    ~15% system time per step, and in the four-model run DeiT-B faulted 430 MiB every step.
    This is what PyTorch's CPU performance guide gets from jemalloc/tcmalloc. Returns
    the settings made, or None where the C library is not glibc (then nothing changes).
    """
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
    """This process's peak resident set (Linux VmHWM). Not getrusage's ru_maxrss: Linux carries
    that across exec, so a child started by a large parent would report the parent's peak."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (2 ** 20 if sys.platform == "darwin" else 1024)
