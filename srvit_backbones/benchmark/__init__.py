"""The measuring harness of tools/benchmark.py and tools/gpu_check.py (both thin entry points):

- ``timing``: the ``Timer`` (device synchronised, peak memory), paired ratios of interleaved
  rounds, glibc's allocator settings, the process's peak memory, ``cosine``;
- ``hardware``: the machine record of every JSON, the GPUs' dense peaks (``PEAK_TFLOPS``) and MFU;
- ``backbones``: SR-ViT variants and their same-depth anchors, with their steps;
- ``attention``: the relative-position kernels beside flash attention and detectron2's formula;
- ``launches``: kernel launches counted without a GPU (the aten operations that do work);
- ``devices``: the GPU's branches (kernel choices, a tiny model) against the CPU;
- ``data``: synthetic files (an ImageFolder for the pretraining step);
- ``runner``: tools/benchmark.py itself (interleaved rounds, compiled against eager, peak-memory
  processes, the paired comparisons, the JSON);
- ``gpu_check``: tools/gpu_check.py's checks (a)-(g), the figures they are read against, its JSON.

The frameworks' parts live with their adapters (the GPU check reaches them through
``srvit_backbones.frameworks``): ``srvit_backbones.detectron2.benchmark`` (a
config's detector step, detectron2's trainer, synthetic COCO-like batches, ViTDet's ``ViT`` as
an anchor) and ``srvit_backbones.mmseg.benchmark`` (a segmentor's step, synthetic ADE20K-like
batches). Importing this package imports neither detectron2 nor OpenMMLab.
"""
from .hardware import PEAK_TFLOPS, machine_record, model_flops_utilisation, peak_tflops
from .timing import Timer, cosine, keep_freed_memory, paired_ratios, synchronize

__all__ = ["PEAK_TFLOPS", "Timer", "cosine", "keep_freed_memory", "machine_record", "model_flops_utilisation",
           "paired_ratios", "peak_tflops", "synchronize"]
