"""The measuring harness of tools/benchmark.py (``runner``) and tools/gpu_check.py (``gpu_check``):
timer and paired ratios (``timing``), machine record and MFU (``hardware``), backbones and anchors
(``backbones``), attention kernels (``attention``), launch counts (``launches``), device branches
(``devices``), synthetic files (``data``). The frameworks' parts live with their adapters
(``srvit_backbones.detectron2.benchmark``, ``srvit_backbones.mmseg.benchmark``); importing this
package imports neither detectron2 nor OpenMMLab.
"""
from .hardware import PEAK_TFLOPS, machine_record, model_flops_utilisation, peak_tflops
from .timing import Timer, cosine, keep_freed_memory, paired_ratios, synchronize

__all__ = ["PEAK_TFLOPS", "Timer", "cosine", "keep_freed_memory", "machine_record", "model_flops_utilisation",
           "paired_ratios", "peak_tflops", "synchronize"]
