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

The figures are those of one fvcore trace of each whole model (--plain), counted faster: each
distinct block application of a backbone traced once and multiplied (srvit_backbones.flops), and
the neck and heads once for the configs that differ only in their backbone, with the RPN's NMS
off (it has no FLOPs; the box head is checked to run on all its proposals).
"""
import argparse
import copy
import json
import os
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.nn as nn

import srvit_backbones
from srvit_backbones.flops import (attention_split, count_by_operator, count_flops, count_flops_by_operator,
                                   count_params, fvcore_analysis)
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
    parser.add_argument("--plain", action="store_true",
                        help="trace every model whole (every block application, the heads of every config): "
                             "the same figures, slower; a check of the shortcuts")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- Table 2
def measure_variant(name, size, num_classes, plain=False):
    model = create_srvit(name, num_classes=num_classes, img_size=size)
    x = torch.randn(1, 3, *size)
    return dict(model=name, T=model.num_steps, d_eff=model.effective_depth,
                params_m=count_params(model) / 1e6, gflops=count_flops(model, (x,), plain=plain) / 1e9,
                input=f"{size[0]}x{size[1]}")


def classification_rows(args):
    if len(args.size) not in (1, 2):
        sys.exit("--size takes one (square) or two (H W) values")
    size = tuple(args.size) * (2 // len(args.size))
    for name in args.models:
        if name not in VARIANTS:
            sys.exit(f"unknown model {name!r}; known: {', '.join(VARIANTS)}")
    return [measure_variant(name, size, args.num_classes, args.plain) for name in args.models]


# ----------------------------------------------------------------------------- Table 4
def config_name(path):
    """The row's name: the config's file name, with its shipped subfolder where it has one
    (``cascade/`` and ``lvis/`` hold configs of the same names)."""
    name = os.path.splitext(os.path.basename(path))[0]
    for framework in {f for fs in FRAMEWORKS.values() for f in fs}:
        folder = os.path.relpath(os.path.dirname(os.path.abspath(path)), srvit_backbones.config_dir(framework))
        if folder in srvit_backbones.config_folders(framework):
            return f"{folder}/{name}"
    return name


def table4_row(path, task, size, params, params_run, gflops, gflops_run, gflops_full):
    return dict(model=config_name(path), task=task, input=f"{size[0]}x{size[1]}",
                params_m=params / 1e6, params_m_run=params_run / 1e6, gflops=gflops / 1e9,
                gflops_run=gflops_run / 1e9, gflops_full=gflops_full / 1e9)


@dataclass
class Counted:
    """What the configs measured so far counted, for the next ones: block applications (see
    ``srvit_backbones.flops.BlockApplications``), and the rest of a model (neck and heads) by its
    config without the backbone and the backbone's input and output shapes: the configs of one
    task differ mostly in the backbone, and the heads cost as much as the blocks."""

    blocks: dict = field(default_factory=dict)
    heads: dict = field(default_factory=dict)


def _map_tensors(fn, tree):
    """``fn`` over the tensors of a nested dict / list / tuple (a backbone's output)."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _map_tensors(fn, v) for k, v in tree.items()}
    return type(tree)(_map_tensors(fn, v) for v in tree)


class _StandIn(nn.Module):
    """Zeros shaped like a backbone's output, in the backbone's place: what follows it is
    counted without running it."""

    def __init__(self, output):
        super().__init__()
        self.output = _map_tensors(torch.zeros_like, output)

    def forward(self, x):
        return _map_tensors(lambda t: x.new_zeros(t.shape, dtype=t.dtype), self.output)


def count_parts(model, inputs, backbone_name, backbone_input, config, counted, analysis=fvcore_analysis,
                heads_counted=nullcontext):
    """FLOPs by operator of ``model(inputs)`` as one trace by ``analysis`` counts them, in two parts: the
    backbone (the submodule ``backbone_name``, which the model calls on ``backbone_input``),
    each distinct block application traced once; the rest, traced with a ``_StandIn`` for the
    backbone once per ``config`` (the model's config without the backbone) and backbone shapes,
    in ``heads_counted(model)``."""
    parent_name, _, name = backbone_name.rpartition(".")
    parent = model.get_submodule(parent_name)
    backbone = getattr(parent, name)
    outputs = []
    hook = backbone.register_forward_hook(lambda module, args, output: outputs.append(output))
    try:
        counts = count_flops_by_operator(backbone, (backbone_input,), analysis, traced=counted.blocks)
    finally:
        hook.remove()
    key = (config, tuple(backbone_input.shape), repr(_map_tensors(lambda t: tuple(t.shape), outputs[0])))
    if key not in counted.heads:
        setattr(parent, name, _StandIn(outputs[0]))
        try:
            with heads_counted(model):
                counted.heads[key] = count_by_operator(model, inputs, analysis)
        finally:
            setattr(parent, name, backbone)
    return counts + counted.heads[key]


@contextmanager
def _proposals_checked(set_nms_threshold, num_proposals, expected):
    """The RPN's NMS off (``set_nms_threshold(1.0)``: it has no FLOPs, and on a stand-in's
    zero features it would drop many proposals); after the count, the box head must have run
    on all ``expected`` proposals (``num_proposals()``), as it does on real features."""
    threshold = set_nms_threshold(1.0)
    try:
        yield
    finally:
        set_nms_threshold(threshold)
    if num_proposals() != expected:
        raise RuntimeError(f"the box head ran on {num_proposals()} proposals, not the {expected} it runs on at "
                           f"test time: the count would be too low (count with --plain)")


@contextmanager
def _detectron2_proposals(model):
    """``_proposals_checked`` for a detectron2 detector: the RPN's output counted."""
    rpn, seen = model.proposal_generator, []

    def set_nms_threshold(value):
        rpn.nms_thresh, old = value, rpn.nms_thresh
        return old

    hook = rpn.register_forward_hook(lambda module, args, output: seen.append(len(output[0][0])))
    try:
        with _proposals_checked(set_nms_threshold, lambda: seen[0] if seen else 0, rpn.post_nms_topk[False]):
            yield
    finally:
        hook.remove()


def measure_detector(path, counted, plain=False):
    """Mask R-CNN (or cascade) on a square-pad-sized image: the FLOPs of one trace of the
    whole model (``--plain``), or the same by ``count_parts``."""
    from detectron2.config import LazyConfig, instantiate
    from detectron2.utils.analysis import FlopCountAnalysis
    from omegaconf import OmegaConf

    cfg = LazyConfig.load(path)
    side = int(cfg.model.backbone.get("square_pad") or 1024)
    torch.manual_seed(0)
    model = instantiate(cfg.model).eval()
    predictors = getattr(model.roi_heads, "box_predictor", None)
    for predictor in predictors if isinstance(predictors, nn.ModuleList) else [predictors]:
        if hasattr(predictor, "test_score_thresh"):
            predictor.test_score_thresh = 1.01  # nothing detected: the mask head is not counted
    image = [{"image": torch.zeros(3, side, side)}]
    if plain:
        counts = count_by_operator(model, image, FlopCountAnalysis)
    else:
        heads = copy.deepcopy(cfg.model)
        del heads.backbone.net
        counts = count_parts(model, image, "backbone.net", model.preprocess_image(image).tensor,
                             repr(OmegaConf.to_container(heads)), counted, FlopCountAnalysis, _detectron2_proposals)
    full, attention = attention_split(counts)
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


@contextmanager
def _mmdet_proposals(predict):
    """``_proposals_checked`` for an mmdet detector: the rois of the first stage's box head counted."""
    model, seen = predict.model, []
    nms = model.rpn_head.test_cfg.nms

    def set_nms_threshold(value):
        nms.iou_threshold, old = value, nms.iou_threshold
        return old

    extractor = model.roi_head.bbox_roi_extractor
    first = extractor[0] if isinstance(extractor, nn.ModuleList) else extractor
    hook = first.register_forward_pre_hook(lambda module, args: seen.append(len(args[1])))
    try:
        with _proposals_checked(set_nms_threshold, lambda: seen[0] if seen else 0,
                                model.rpn_head.test_cfg.max_per_img):
            yield
    finally:
        hook.remove()


def measure_mmdet_detector(path, counted, plain=False):
    """The whole Mask R-CNN's prediction (backbone, pyramid, RPN, box head on the test
    proposals) on a square image of the test resize's size, as ``measure_detector``."""
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
    predict, x = _MMDetPredict(model, side), torch.zeros(1, 3, side, side)
    if plain:
        counts = count_by_operator(predict, (x,))
    else:
        heads = copy.deepcopy(cfg.model)
        heads.pop("backbone")
        counts = count_parts(predict, (x,), "model.backbone", x, repr(heads.to_dict()), counted,
                             heads_counted=_mmdet_proposals)
    full, attention = attention_split(counts)
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


def measure_segmentor(path, counted, plain=False):
    """The whole UPerNet (mmseg's ``mode='tensor'`` forward: backbone, neck, decode head) on a
    crop-sized image, and the backbone units it prunes, taken from a build of the same backbone
    that returns the last unit too (on the meta device unless ``--plain``: its blocks are
    counted as the held ones are, by ``BlockApplications``)."""
    from mmengine.config import Config
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    import srvit_backbones.mmseg  # noqa: F401  (registers SRViT, also for configs without custom_imports)

    register_all_modules()
    cfg = Config.fromfile(path)
    h, w = cfg.crop_size
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    x = torch.zeros(1, 3, h, w)
    if plain:
        run = count_flops(model, (x,), plain=True)
    else:
        heads = copy.deepcopy(cfg.model)
        heads.pop("backbone")
        run = attention_split(count_parts(model, (x,), "backbone", x, repr(heads.to_dict()), counted))[0]
    held = model.backbone.srvit
    with torch.device("cpu" if plain else "meta"):
        whole = MODELS.build(dict(cfg.model.backbone, out_indices=[*model.backbone.out_indices, -1])).srvit
    pruned = _Units(whole.units[len(held.units):], (h // held.patch_size, w // held.patch_size))
    tokens = torch.zeros(1, held.num_prefix_tokens + pruned.grid[0] * pruned.grid[1], held.embed_dim)
    if not len(pruned.units):
        unused = 0
    elif plain:
        unused = count_flops(pruned, (tokens,), plain=True)
    else:
        unused = attention_split(count_flops_by_operator(pruned, (tokens.to("meta"),), traced=counted.blocks))[0]
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
    counted = Counted()
    return [measure(path, counted, args.plain) for path in paths]

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
