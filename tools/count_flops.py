#!/usr/bin/env python
"""Parameters and GFLOPs of SR-ViT: the variants as classifiers (the paper's Table 2), and the
shipped Mask R-CNN and UPerNet configs as whole models (its Table 4).

    python tools/count_flops.py                      # every variant at 224x224 (Table 2)
    python tools/count_flops.py --size 512 --models srvit_s_t3 srvit_deit_s
    python tools/count_flops.py --num-classes 0 --size 1024   # backbone only
    python tools/count_flops.py --task detection     # every shipped detectron2 config (Table 4)
    python tools/count_flops.py --task detection --framework mmdet   # every shipped mmdet config
    python tools/count_flops.py --task segmentation --configs upernet_srvit_s.py upernet_deit_s.py
    python tools/count_flops.py --task detection --json > detection.json
    python tools/count_flops.py --task detection --configs cascade/ lvis/mask_rcnn_srvit_s_t3.py  # a folder's configs
    python tools/count_flops.py --task detection --framework mmdet --configs cascade/cascade_mask_rcnn_srvit_s_t3_lsj.py

Table 2 (classification) figures are fvcore multiply-adds, attention matmuls included.

Table 4 rows (--task detection at the config's square pad, 1024x1024; --task segmentation at
its crop size, 512x512; one image) carry three counts, because the paper's figures follow two
other conventions than the cost a user pays:
  gflops       the paper's convention. Detection: fvcore multiply-adds without the fused
               attention (fvcore has no handle for scaled_dot_product_attention, so it was not
               counted). Segmentation: 2x the multiply-adds, attention included, and the
               backbone's last block counted although its output is unused (the shipped
               segmentors no longer hold nor run it; its cost is added back, measured on it).
  gflops_run   the same convention for what the shipped model runs: segmentation without the
               unused block; detection as gflops.
  gflops_full  fvcore multiply-adds of everything the shipped model runs, attention included
               (the convention of Table 2): what a forward pass costs.
params_m is the paper's (segmentation: the unused block's parameters added back), params_m_run
what the shipped model holds. A detector's box head runs on its 1000 test proposals; the per-detection mask head
is not counted (nor was it in the paper's figures): the count raises the box predictors' score
threshold above 1, so that nothing is detected (at random initialisation a softmax head detects
nothing anyway; the LVIS configs' sigmoid heads would, and their NMS over 1000 proposals x 1203
classes takes minutes on a CPU).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn as nn

import srvit_backbones
from srvit_backbones.flops import attention_split, count_flops, count_params
from srvit_backbones.models import VARIANTS, create_srvit

TASKS = ("classification", "detection", "segmentation")
FRAMEWORKS = {"detection": ("detectron2", "mmdet"), "segmentation": ("mmseg",)}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=TASKS, default="classification",
                        help="classification: the variants (Table 2); detection / segmentation: the shipped "
                             "configs as whole models (Table 4)")
    parser.add_argument("--models", nargs="+", default=list(VARIANTS), help="classification: variant names")
    parser.add_argument("--size", type=int, nargs="+", default=[224], help="classification: input size, S or H W")
    parser.add_argument("--num-classes", type=int, default=1000, help="classification: classifier size (0: backbone)")
    parser.add_argument("--configs", nargs="+", metavar="CONFIG",
                        help="detection / segmentation: config names (FOLDER/NAME.py in a subfolder; FOLDER/ for "
                             "all of its configs) or paths (default: every shipped one of the top folder)")
    parser.add_argument("--framework", choices=sorted({f for fs in FRAMEWORKS.values() for f in fs}),
                        help="detection / segmentation: whose configs (default: detectron2 / mmseg)")
    parser.add_argument("--json", action="store_true", help="print the rows as a JSON list instead of a table")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- Table 2
def measure_variant(name, size, num_classes):
    model = create_srvit(name, num_classes=num_classes, img_size=size)
    x = torch.randn(1, 3, *size)
    return dict(model=name, T=model.num_steps, d_eff=model.effective_depth,
                params_m=count_params(model) / 1e6, gflops=count_flops(model, (x,)) / 1e9,
                input=f"{size[0]}x{size[1]}")


def classification_rows(args):
    if len(args.size) not in (1, 2):
        sys.exit("--size takes one (square) or two (H W) values")
    size = tuple(args.size) * (2 // len(args.size))
    for name in args.models:
        if name not in VARIANTS:
            sys.exit(f"unknown model {name!r}; known: {', '.join(VARIANTS)}")
    return [measure_variant(name, size, args.num_classes) for name in args.models]


# ----------------------------------------------------------------------------- Table 4
def table4_row(path, task, size, params, params_run, gflops, gflops_run, gflops_full):
    return dict(model=os.path.splitext(os.path.basename(path))[0], task=task, input=f"{size[0]}x{size[1]}",
                params_m=params / 1e6, params_m_run=params_run / 1e6, gflops=gflops / 1e9,
                gflops_run=gflops_run / 1e9, gflops_full=gflops_full / 1e9)


def measure_detector(path):
    """One fvcore pass over the whole Mask R-CNN on a square-pad-sized image."""
    from detectron2.config import LazyConfig, instantiate
    from detectron2.utils.analysis import FlopCountAnalysis

    cfg = LazyConfig.load(path)
    side = int(cfg.model.backbone.get("square_pad") or 1024)
    torch.manual_seed(0)
    model = instantiate(cfg.model).eval()
    predictors = getattr(model.roi_heads, "box_predictor", None)
    for predictor in predictors if isinstance(predictors, nn.ModuleList) else [predictors]:
        if hasattr(predictor, "test_score_thresh"):
            predictor.test_score_thresh = 1.01  # nothing detected: the mask head is not counted
    full, attention = attention_split(FlopCountAnalysis(model, [{"image": torch.zeros(3, side, side)}]))
    params = count_params(model)
    return table4_row(path, "detection", (side, side), params, params, full - attention, full - attention, full)


class _MMDetPredict(nn.Module):
    """An mmdet detector's ``predict`` on one padded image, as a module fvcore can trace."""

    def __init__(self, model, side):
        super().__init__()
        from mmdet.structures import DetDataSample

        self.model = model
        self.samples = [DetDataSample(metainfo=dict(img_shape=(side, side), ori_shape=(side, side),
                                                    pad_shape=(side, side), batch_input_shape=(side, side),
                                                    scale_factor=(1.0, 1.0)))]

    def forward(self, x):
        result = self.model.predict(x, self.samples, rescale=False)[0].pred_instances
        return result.bboxes, result.scores


def measure_mmdet_detector(path):
    """One fvcore pass over the whole Mask R-CNN's prediction (backbone, pyramid, RPN, box head on
    the test proposals) on a square image of the test resize's size, as ``measure_detector``."""
    from fvcore.nn import FlopCountAnalysis
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    import srvit_backbones.mmdet  # noqa: F401  (registers SRViT, also for configs without custom_imports)

    register_all_modules()
    cfg = Config.fromfile(path)
    resize = next((t for t in cfg.test_dataloader.dataset.pipeline if t.type == "Resize"), None)
    side = int(max(resize.scale)) if resize is not None and resize.get("scale") else 1024
    cfg.model.backbone.pop("init_cfg", None)
    cfg.model.test_cfg.rcnn.score_thr = 1.01  # nothing detected: the mask head is not counted
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    full, attention = attention_split(FlopCountAnalysis(_MMDetPredict(model, side), (torch.zeros(1, 3, side, side),)))
    params = count_params(model)
    return table4_row(path, "detection", (side, side), params, params, full - attention, full - attention, full)


class _Units(nn.Module):
    """Backbone units run on the tokens of a patch grid (units a shipped segmentor prunes)."""

    def __init__(self, units, grid):
        super().__init__()
        self.units, self.grid = units, grid

    def forward(self, x):
        for unit in self.units:
            x = unit(x, grid=self.grid)
        return x


def measure_segmentor(path):
    """One fvcore pass over the whole UPerNet (mmseg's ``mode='tensor'`` forward: backbone,
    neck, decode head) on a crop-sized image, and one over the backbone units it prunes, taken
    from a build of the same backbone that returns the last unit too."""
    from mmengine.config import Config
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    import srvit_backbones.mmseg  # noqa: F401  (registers SRViT, also for configs without custom_imports)

    register_all_modules()
    cfg = Config.fromfile(path)
    h, w = cfg.crop_size
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    run = count_flops(model, (torch.zeros(1, 3, h, w),))
    held = model.backbone.srvit
    whole = MODELS.build(dict(cfg.model.backbone, out_indices=[*model.backbone.out_indices, -1])).srvit
    pruned = _Units(whole.units[len(held.units):], (h // held.patch_size, w // held.patch_size))
    tokens = torch.zeros(1, held.num_prefix_tokens + pruned.grid[0] * pruned.grid[1], held.embed_dim)
    unused = count_flops(pruned, (tokens,)) if len(pruned.units) else 0
    params = count_params(model)
    return table4_row(path, "segmentation", (h, w), params + count_params(pruned), params, 2 * (run + unused),
                      2 * run, run)


def table4_rows(args):
    framework = args.framework or FRAMEWORKS[args.task][0]
    if framework not in FRAMEWORKS[args.task]:
        sys.exit(f"--framework {framework} has no {args.task} configs; choose {' or '.join(FRAMEWORKS[args.task])}")
    names = args.configs or srvit_backbones.list_configs(framework)
    try:
        # a shipped folder ("cascade/") stands for its configs
        names = [n for name in names for n in (srvit_backbones.list_configs(framework, name)
                                               if name.endswith("/") else [name])]
        paths = [srvit_backbones.resolve_config(framework, name) for name in names]
    except FileNotFoundError as e:
        sys.exit(str(e))
    measure = {"detectron2": measure_detector, "mmdet": measure_mmdet_detector, "mmseg": measure_segmentor}[framework]
    return [measure(path) for path in paths]


# ----------------------------------------------------------------------------- output
def print_table(rows, task):
    if task == "classification":
        print(f"{'model':<14} {'T':>2} {'D_eff':>5} {'params (M)':>10} {'GFLOPs':>8}  input")
        for r in rows:
            print(f"{r['model']:<14} {r['T']:>2} {r['d_eff']:>5} {r['params_m']:>10.3f} {r['gflops']:>8.2f}  "
                  f"{r['input']}")
        return
    convention = ("paper: fvcore multiply-adds without the fused attention" if task == "detection" else
                  "paper: 2x multiply-adds, attention and the unused last backbone block included")
    print(f"# {task}, whole model. gflops: {convention}; gflops_run: that convention for what the shipped "
          f"model runs; gflops_full: multiply-adds of what it runs, attention included (what a forward pass "
          f"costs). params_m: the paper's; params_m_run: held.")
    width = max(len(r["model"]) for r in rows)
    print(f"{'model':<{width}} {'params_m':>9} {'params_m_run':>12} {'gflops':>8} {'gflops_run':>10} "
          f"{'gflops_full':>11}  input")
    for r in rows:
        print(f"{r['model']:<{width}} {r['params_m']:>9.2f} {r['params_m_run']:>12.2f} {r['gflops']:>8.1f} "
              f"{r['gflops_run']:>10.1f} {r['gflops_full']:>11.1f}  {r['input']}")


def main(argv=None):
    args = parse_args(argv)
    rows = classification_rows(args) if args.task == "classification" else table4_rows(args)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows, args.task)
    return rows


if __name__ == "__main__":
    main()
