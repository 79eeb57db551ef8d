#!/usr/bin/env python
"""Pictures of the soft router on real images, in the style of the paper's Figure 4. For every
recursive unit with a router: the step each token weights most (argmax) and how undecided the
router is (the mixture's entropy / log T: 0 = all weight on one step, 1 = uniform), overlaid
on the image, and the mean weight per step over the tokens. One PNG per image, and
summary.png: the mean weight per step over all tokens of all images.

    python tools/visualize_mixture.py --model srvit_s_t3 --checkpoint output/pretrain/last.pth --input photos/
    python tools/visualize_mixture.py --model srvit_s_t3 --checkpoint output/model_final.pth \\
        --input 'val2017/*.jpg' --size 512 --keep-aspect --out-dir mixture_det
    python tools/visualize_mixture.py --model srvit_s_t3 --checkpoint work_dirs/upernet_srvit_s/iter_160000.pth \\
        --input photo.jpg --amp

--checkpoint: a tools/pretrain.py checkpoint, a detectron2 model_final.pth or an mmseg
iter_N.pth; the backbone is found inside it. --model (and --set) must name the variant it
was trained as; a checkpoint of another width or T is refused with the reason. The model is
built with the checkpoint's position table, resized to each input as the frameworks do.
Without --input: scikit-image's astronaut photo. Without --checkpoint: a random model (router
initialised non-zero so that the maps vary), whose pictures mean nothing. With 'hard'
aggregation the applied weights are one-hot: the entropy is 0 everywhere.
"""
import argparse
import glob
import math
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from PIL import Image  # noqa: E402
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # noqa: E402

from srvit_backbones import CheckpointError, create_srvit, load_pretrained  # noqa: E402
from srvit_backbones.amp import amp_dtype, autocast  # noqa: E402
from srvit_backbones.checkpoint import read_checkpoint  # noqa: E402
from srvit_backbones.export import RESERVED, parse_override, table_img_size  # noqa: E402

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def find_images(spec: Optional[str]) -> List[Optional[Path]]:
    """The images named by ``--input``: a file, the images of a folder, or a glob pattern
    (sorted); [None] (the astronaut photo) without one."""
    if not spec:
        return [None]
    if any(c in spec for c in "*?["):
        paths = [Path(p) for p in sorted(glob.glob(spec, recursive=True))]
    elif os.path.isdir(spec):
        paths = sorted(Path(spec).iterdir())
    elif os.path.isfile(spec):
        return [Path(spec)]
    else:
        raise SystemExit(f"error: --input {spec}: no such file or folder")
    images = [p for p in paths if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS]
    if not images:
        raise SystemExit(f"error: no images at --input {spec} (looked for {', '.join(IMAGE_EXTENSIONS)} files); "
                         f"give an image, a folder of images or a glob pattern such as 'photos/*.jpg'")
    stems = [p.stem for p in images]
    twins = sorted({s for s in stems if stems.count(s) > 1})
    if twins:
        raise SystemExit(f"error: several inputs are named {twins} (the PNGs are named after the image): "
                         f"give them different names or visualise them in separate runs")
    return images


def load_image(path: Optional[Path], size: int, keep_aspect: bool, patch: int) -> np.ndarray:
    """RGB uint8 (H, W, 3): size x size, or with ``keep_aspect`` the short side ``size`` and the
    long side the multiple of the patch size nearest to the aspect ratio."""
    if path is None:
        from skimage import data

        image = Image.fromarray(data.astronaut())
    else:
        image = Image.open(path).convert("RGB")
    width, height = size, size
    if keep_aspect:
        long = max(patch, round(size * max(image.size) / min(image.size) / patch) * patch)
        width, height = (long, size) if image.width >= image.height else (size, long)
    return np.array(image.resize((width, height), Image.BICUBIC))


def to_batch(image: np.ndarray) -> torch.Tensor:
    """(1, 3, H, W) normalised with ImageNet's mean and std, as in pretraining."""
    x = torch.from_numpy(image).permute(2, 0, 1).float().div(255)
    mean, std = torch.tensor(IMAGENET_DEFAULT_MEAN), torch.tensor(IMAGENET_DEFAULT_STD)
    return ((x - mean[:, None, None]) / std[:, None, None])[None]


def routed_units(model) -> List[int]:
    """The recursive units that have a router (T > 1, aggregation 'soft' or 'hard')."""
    return [i for i in model.recursive_unit_indices if model.units[i].router is not None]


def mixture_stats(model, x: torch.Tensor, units: Sequence[int], amp: bool = False,
                  device: str = "cpu") -> Dict[int, Dict[str, torch.Tensor]]:
    """Per unit: the (T, h, w) mixture weights, the argmax step (0-based), the entropy divided
    by log T (rounding clamped to [0, 1]), and per step the mean weight and the share of tokens
    whose argmax it is (both over the tokens, each summing to 1)."""
    with torch.no_grad(), autocast(device, amp):
        feats = model.forward_feature_maps(x.to(device), indices=list(units), return_mixture=True)
    stats = {}
    for i in units:
        weights = feats[f"mixture{i}"][0].float().cpu()  # (T, h, w)
        steps = weights.shape[0]
        argmax = weights.argmax(0)
        entropy = -(weights * weights.clamp_min(1e-12).log()).sum(0) / math.log(steps)
        stats[i] = dict(weights=weights, argmax=argmax, entropy=entropy.clamp(0, 1),
                        mean_weight=weights.mean((1, 2)),
                        argmax_share=torch.bincount(argmax.flatten(), minlength=steps).float() / argmax.numel())
    return stats


def step_colors(steps: int) -> ListedColormap:
    """A discrete colormap, one colour per step."""
    if steps <= 10:
        return ListedColormap([plt.get_cmap("tab10")(t) for t in range(steps)])
    return ListedColormap(plt.get_cmap("viridis")(np.linspace(0, 1, steps)))


def unit_label(model, i: int) -> str:
    return f"unit {i} (R{len(model.units[i].blocks)})"


def draw_bars(ax, mean_weight: torch.Tensor, argmax_share: torch.Tensor, title: str, legend: bool):
    steps = len(mean_weight)
    colors = step_colors(steps)
    t = np.arange(1, steps + 1)
    ax.bar(t - 0.18, mean_weight.numpy(), width=0.36, color=[colors(s) for s in range(steps)], label="mean weight")
    ax.bar(t + 0.18, argmax_share.numpy(), width=0.36, color=[colors(s) for s in range(steps)], alpha=0.45,
           hatch="//", label="argmax share")
    ax.axhline(1 / steps, color="gray", lw=0.8, ls="--", label="uniform")
    ax.set(xticks=t, xticklabels=[f"step {s}" for s in t], ylim=(0, 1.15), yticks=np.linspace(0, 1, 6), title=title)
    if legend:
        ax.legend(fontsize=7, frameon=False, loc="upper left", ncol=3, handlelength=1.2, columnspacing=0.8)


def plot_image(model, image: np.ndarray, stats: Dict[int, Dict[str, torch.Tensor]], out: str, name: str) -> List[str]:
    """One row per unit: argmax step and entropy over the image, and the mean weight per step.
    Returns the panel titles, row by row."""
    height, width = image.shape[:2]
    extent = (0, width, height, 0)  # each token covers its patch
    fig, axes = plt.subplots(len(stats), 3, figsize=(3 * width / height * 2 + 3.5, 3.3 * len(stats)),
                             squeeze=False, layout="constrained",
                             gridspec_kw=dict(width_ratios=[width / height] * 2 + [1]))
    for r, (row, (i, s)) in enumerate(zip(axes, stats.items())):
        steps = len(s["mean_weight"])
        row[0].imshow(image)
        row[0].imshow(s["argmax"].numpy(), cmap=step_colors(steps), vmin=-0.5, vmax=steps - 0.5, alpha=0.55,
                      interpolation="nearest", extent=extent)
        row[0].set_title(f"{unit_label(model, i)}: argmax step")
        row[0].legend(handles=[Patch(color=step_colors(steps)(t), label=f"step {t + 1}") for t in range(steps)],
                      loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(steps, 5), fontsize=7, frameon=False)
        row[1].imshow(image)
        im = row[1].imshow(s["entropy"].numpy(), cmap="magma", vmin=0, vmax=1, alpha=0.6, interpolation="nearest",
                           extent=extent)
        row[1].set_title(f"{unit_label(model, i)}: entropy / log T")
        fig.colorbar(im, ax=row[1], shrink=0.8)
        for ax in row[:2]:
            ax.axis("off")
        draw_bars(row[2], s["mean_weight"], s["argmax_share"], f"{unit_label(model, i)}: weight per step", r == 0)
    fig.suptitle(f"{name} ({width}x{height})")
    fig.savefig(out, dpi=100, bbox_inches="tight")
    titles = [ax.get_title() for ax in axes.flat]
    plt.close(fig)
    return titles


def plot_summary(model, summary: Dict[int, Dict[str, torch.Tensor]], out: str, n_images: int, n_tokens: int):
    """The mean weight and argmax share per step of every unit, over all tokens of all images."""
    fig, axes = plt.subplots(1, len(summary), figsize=(3.6 * len(summary), 3.4), squeeze=False, layout="constrained")
    for k, (ax, (i, s)) in enumerate(zip(axes[0], summary.items())):
        draw_bars(ax, s["mean_weight"], s["argmax_share"], unit_label(model, i), k == 0)
    fig.suptitle(f"weight per step over {n_images} image(s), {n_tokens} tokens per unit")
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


def build_model(args):
    """The variant with the checkpoint's weights (or random ones), cut after its last routed unit."""
    overrides = dict(args.overrides)
    reserved = sorted(set(overrides) & set(RESERVED))
    if reserved:
        raise SystemExit(f"error: {reserved} cannot be set: the tool builds the model at the checkpoint's "
                         f"position-table size (224 for a random model) without a classifier")
    checkpoint = read_checkpoint(args.checkpoint) if args.checkpoint else None
    img_size = (table_img_size(checkpoint) if checkpoint is not None else None) or 224
    kwargs = dict(num_classes=0, img_size=img_size, zero_init_recursion=checkpoint is not None)
    try:
        model = create_srvit(args.model, **dict(kwargs, **overrides))
    except (TypeError, ValueError) as e:
        raise SystemExit(f"error: cannot build {args.model} with {overrides}: {e}") from None
    units = routed_units(model)
    if not units:
        raise SystemExit(f"error: {args.model} (T={model.num_steps}, aggregation "
                         f"'{model.units[1].aggregation}') has no router: T=1 and 'last' aggregation use no mixture "
                         f"weights; pick an SR-ViT variant with T >= 2 and 'soft' or 'hard' aggregation")
    patch = model.patch_size
    if args.size < patch or args.size % patch:
        lower = args.size // patch * patch
        near = f"{lower} or {lower + patch}" if lower >= patch else f"{patch}"
        raise SystemExit(f"error: --size {args.size} is not a multiple of the patch size {patch}: use {near}")
    # the units after the last router (and the final norm, the classifier) play no part
    model.prune_intermediate_layers(units, prune_norm=True)
    if checkpoint is None:
        print("warning: no --checkpoint: a random model (router initialised non-zero); these pictures show the "
              "tool working, not what a trained router does", file=sys.stderr)
    else:
        report = load_pretrained(model, checkpoint, prefer_ema=args.ema)
        print(f"weights: {args.checkpoint}\n{report.summary()}")
    return model.eval().to(args.device), units


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="srvit_s_t3", help="SR-ViT variant the checkpoint was trained as")
    parser.add_argument("--checkpoint", default="", help="tools/pretrain.py, detectron2 or mmseg checkpoint "
                                                         "(default: a random model)")
    parser.add_argument("--ema", action="store_true", help="take a pretraining checkpoint's EMA weights")
    parser.add_argument("--set", dest="overrides", type=parse_override, nargs="+", default=[], metavar="KEY=VALUE",
                        help="model arguments, as for timm.create_model (e.g. num_steps=4 embed_dim=32)")
    parser.add_argument("--input", default="", help="an image, a folder of images or a glob pattern "
                                                    "(default: scikit-image's astronaut photo)")
    parser.add_argument("--size", type=int, default=224, help="input size, a multiple of 16 (default 224)")
    parser.add_argument("--keep-aspect", action="store_true",
                        help="resize the short side to --size and keep the aspect ratio")
    parser.add_argument("--out-dir", default="mixture", help="folder for the PNGs (default: mixture)")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast on a CPU with native bf16, fp16 on CUDA "
                                                           "(the router's softmax stays fp32)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    return parser


def main(argv: Optional[Sequence[str]] = None):
    """Returns the per-image statistics (``images``: path, png, size, units) and the summary."""
    args = build_parser().parse_args(argv)
    if args.amp:
        try:
            amp_dtype(args.device)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    paths = find_images(args.input)
    try:
        model, units = build_model(args)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
    os.makedirs(args.out_dir, exist_ok=True)
    results, sums, tokens = [], {i: None for i in units}, 0
    for path in paths:
        image = load_image(path, args.size, args.keep_aspect, model.patch_size)
        stats = mixture_stats(model, to_batch(image), units, args.amp, args.device)
        name = path.stem if path is not None else "astronaut"
        png = os.path.join(args.out_dir, f"{name}_mixture.png")
        titles = plot_image(model, image, stats, png, path.name if path is not None else "astronaut")
        n = stats[units[0]]["argmax"].numel()
        for i, s in stats.items():
            total = torch.stack([s["mean_weight"], s["argmax_share"]]) * n
            sums[i] = total if sums[i] is None else sums[i] + total
        tokens += n
        results.append(dict(path=path, png=png, size=image.shape[:2], panels=titles, units=stats))
        print(f"wrote {png}: {image.shape[1]}x{image.shape[0]}, mean weight per step " + "; ".join(
            f"unit {i} " + "/".join(f"{w:.2f}" for w in s["mean_weight"].tolist()) for i, s in stats.items()))
    summary = {i: dict(mean_weight=sums[i][0] / tokens, argmax_share=sums[i][1] / tokens) for i in units}
    summary_png = os.path.join(args.out_dir, "summary.png")
    plot_summary(model, summary, summary_png, len(paths), tokens)
    print(f"wrote {summary_png}: {len(paths)} image(s), {tokens} tokens")
    for i, s in summary.items():
        print(f"  {unit_label(model, i)}: mean weight per step " + " ".join(f"{w:.3f}" for w in s["mean_weight"])
              + ", argmax share " + " ".join(f"{w:.3f}" for w in s["argmax_share"]))
    return dict(images=results, summary=summary, summary_png=summary_png)


if __name__ == "__main__":
    main()
