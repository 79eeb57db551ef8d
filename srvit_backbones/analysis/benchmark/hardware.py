"""The machine record of every JSON, and the GPUs' dense peaks behind MFU."""
import os
import platform
import subprocess

import torch

#: dense fp16 / bf16 peak TFLOP/s (NVIDIA datasheets, SXM), matched in order against the GPU's name
PEAK_TFLOPS = (("H100 PCIe", 756), ("H200", 989), ("H100", 989), ("A100", 312), ("L40S", 362), ("L4", 121),
               ("A10", 125), ("V100", 125))


def peak_tflops(gpu_name):
    """The dense fp16 / bf16 peak of a GPU in PEAK_TFLOPS, or None."""
    return next((peak for key, peak in PEAK_TFLOPS if gpu_name and key in gpu_name), None)


def model_flops_utilisation(img_per_s, gmacs, gpu_name):
    """Achieved TFLOP/s (2 FLOPs a multiply-add) at ``img_per_s`` and ``gmacs`` per image, and its
    fraction of ``gpu_name``'s peak (``mfu``; None for a GPU not in PEAK_TFLOPS)."""
    achieved = 2 * gmacs * img_per_s / 1e3
    peak = peak_tflops(gpu_name)
    return dict(gmacs=gmacs, achieved_tflops=achieved, peak_tflops=peak or "unknown",
                mfu=achieved / peak if peak else None)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def machine_record(device) -> dict:
    """Versions, CPU, threads, the GPU's name and, on CUDA, its driver and clocks (nvidia-smi)."""
    from ... import __version__

    device = torch.device(device)
    record = dict(platform=platform.platform(), processor=cpu_name(), cpus=os.cpu_count(),
                  torch_threads=torch.get_num_threads(), torch=torch.__version__, cuda=torch.version.cuda,
                  srvit_backbones=__version__, device=str(device),
                  gpu=torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    if device.type == "cuda":
        query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit"
        try:
            out = subprocess.run(["nvidia-smi", "-i", str(device.index or 0), f"--query-gpu={query}",
                                  "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
            record.update(zip(query.split(","), (v.strip() for v in out.split(","))))
        except (OSError, IndexError, subprocess.SubprocessError) as e:
            record["nvidia_smi"] = f"not available: {e}"
    return record
