"""The rows of tools/count_flops.py: Table 2 (classification: multiply-adds, attention included) and
Table 4 (a detector at 1024x1024, a segmentor at its 512x512 crop): ``gflops`` in the paper's convention
(detection: multiply-adds without the fused attention; segmentation: 2x multiply-adds with the unused
last block), ``gflops_run`` that convention for what the shipped model runs, ``gflops_full`` the
multiply-adds a forward pass costs; ``params_m`` the paper's, ``params_m_run`` held. A detector's mask
head is not counted. See docs/detectron2.md and docs/mmseg.md.
"""
import os
from typing import Dict, List, Sequence, Tuple

import torch

from ..config_files import config_dir, config_folders
from ..frameworks import shipped_in
from ..models import VARIANTS, create_srvit
from .flops import count_flops, count_params


def measure_variant(name: str, size: Tuple[int, int], num_classes: int, plain: bool = False) -> Dict:
    """A Table 2 row: the variant ``name`` with ``num_classes`` (0: the backbone) on one (H, W) image."""
    model = create_srvit(name, num_classes=num_classes, img_size=size)
    x = torch.randn(1, 3, *size)
    return dict(model=name, T=model.num_steps, d_eff=model.effective_depth,
                params_m=count_params(model) / 1e6, gflops=count_flops(model, (x,), plain=plain) / 1e9,
                input=f"{size[0]}x{size[1]}")


def classification_rows(models: Sequence[str], size: Sequence[int], num_classes: int = 1000,
                        plain: bool = False) -> List[Dict]:
    """The Table 2 rows of the variants ``models`` at ``size`` (S for a square, or H W).

    Raises:
        ValueError: a bad size or an unknown model, before anything is counted."""
    if len(size) not in (1, 2):
        raise ValueError("--size takes one (square) or two (H W) values")
    size = tuple(size) * (2 // len(size))
    for name in models:
        if name not in VARIANTS:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(VARIANTS)}")
    return [measure_variant(name, size, num_classes, plain) for name in models]


def config_name(path: str) -> str:
    """The config's file name, with its shipped subfolder (``cascade/``, ``lvis/``) where it has one."""
    name = os.path.splitext(os.path.basename(path))[0]
    framework = shipped_in(path)
    if framework:
        folder = os.path.relpath(os.path.dirname(os.path.abspath(path)), config_dir(framework))
        if folder in config_folders(framework):
            return f"{folder}/{name}"
    return name


def table_row(path: str, task: str, size: Tuple[int, int], params: int, params_run: int, gflops: float,
              gflops_run: float, gflops_full: float) -> Dict:
    """A Table 4 row of the config ``path`` from counts in parameters and FLOPs."""
    return dict(model=config_name(path), task=task, input=f"{size[0]}x{size[1]}",
                params_m=params / 1e6, params_m_run=params_run / 1e6, gflops=gflops / 1e9,
                gflops_run=gflops_run / 1e9, gflops_full=gflops_full / 1e9)


def format_table(rows: List[Dict], task: str) -> str:
    """count_flops' printed table of ``rows`` (Table 2's columns for ``classification``, else Table 4's)."""
    if task == "classification":
        return "\n".join([f"{'model':<14} {'T':>2} {'D_eff':>5} {'params (M)':>10} {'GFLOPs':>8}  input"] + [
            f"{r['model']:<14} {r['T']:>2} {r['d_eff']:>5} {r['params_m']:>10.3f} {r['gflops']:>8.2f}  {r['input']}"
            for r in rows])
    convention = ("paper: fvcore multiply-adds without the fused attention" if task == "detection" else
                  "paper: 2x multiply-adds, attention and the unused last backbone block included")
    width = max(len(r["model"]) for r in rows)
    return "\n".join([
        f"# {task}, whole model. gflops: {convention}; gflops_run: that convention for what the shipped "
        f"model runs; gflops_full: multiply-adds of what it runs, attention included (what a forward pass "
        f"costs). params_m: the paper's; params_m_run: held.",
        f"{'model':<{width}} {'params_m':>9} {'params_m_run':>12} {'gflops':>8} {'gflops_run':>10} "
        f"{'gflops_full':>11}  input"] + [
        f"{r['model']:<{width}} {r['params_m']:>9.2f} {r['params_m_run']:>12.2f} {r['gflops']:>8.1f} "
        f"{r['gflops_run']:>10.1f} {r['gflops_full']:>11.1f}  {r['input']}" for r in rows])
