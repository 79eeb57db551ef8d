"""The soft router on real images, as the paper's Figure 4 (tools/visualize_mixture.py): per routed unit,
each token's argmax step and mixture entropy / log T, and the mean weight per step (matplotlib, no pyplot)."""
import math
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..checkpoint import LoadReport, load_pretrained, read_checkpoint
from ..errors import ConfigError, InputError
from ..models import create_srvit
from ..training.amp import autocast
from .demo import check_device
from .export import RESERVED, table_img_size
from .images import load_image, to_batch

Stats = Dict[int, Dict[str, torch.Tensor]]


def build_model(variant: str, overrides: Sequence[Tuple[str, object]] = (), checkpoint: str = "", ema: bool = False,
                size: int = 224, amp: bool = False,
                device: str = "cpu") -> Tuple[torch.nn.Module, List[int], Optional[LoadReport]]:
    """(the variant with the weights and position table of ``checkpoint`` (pretraining, detectron2 or
    mmseg; none: random), cut after its last routed unit; its routed units; the ``LoadReport``).

    Raises:
        CheckpointError: a file that is no checkpoint, or one that does not fit (another width or T).
        ConfigError: a reserved argument, no router, ``size`` not a multiple of the patch size, no amp."""
    check_device(device, amp)
    overrides = dict(overrides)
    reserved = sorted(set(overrides) & set(RESERVED))
    if reserved:
        raise ConfigError(f"{reserved} cannot be set: the tool builds the model at the checkpoint's "
                          f"position-table size (224 for a random model) without a classifier")
    weights = read_checkpoint(checkpoint) if checkpoint else None
    img_size = (table_img_size(weights) if weights is not None else None) or 224
    kwargs = dict(num_classes=0, img_size=img_size, zero_init_recursion=weights is not None)
    try:
        model = create_srvit(variant, **dict(kwargs, **overrides))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cannot build {variant} with {overrides}: {e}") from None
    units = [i for i in model.recursive_unit_indices if model.units[i].router is not None]
    if not units:
        raise ConfigError(f"{variant} (T={model.num_steps}, aggregation "
                          f"'{model.units[1].aggregation}') has no router: T=1 and 'last' aggregation use no mixture "
                          f"weights; pick an SR-ViT variant with T >= 2 and 'soft' or 'hard' aggregation")
    patch = model.patch_size
    if size < patch or size % patch:
        lower = size // patch * patch
        near = f"{lower} or {lower + patch}" if lower >= patch else f"{patch}"
        raise ConfigError(f"--size {size} is not a multiple of the patch size {patch}: use {near}")
    model.prune_intermediate_layers(units, prune_norm=True)
    report = load_pretrained(model, weights, prefer_ema=ema) if weights is not None else None
    return model.eval().to(device), units, report


def picture_names(paths: Sequence[Optional[str]]) -> List[str]:
    """The name each image's pictures take (its file's stem; "astronaut" for None).

    Raises:
        InputError: two images share one."""
    stems = [os.path.splitext(os.path.basename(p))[0] if p is not None else "astronaut" for p in paths]
    twins = sorted({s for s in stems if stems.count(s) > 1})
    if twins:
        raise InputError(f"several inputs are named {twins} (the PNGs are named after the image): "
                         f"give them different names or visualise them in separate runs")
    return stems


def mixture_stats(model, x: torch.Tensor, units: Sequence[int], amp: bool = False, device: str = "cpu") -> Stats:
    """Per unit: the (T, h, w) mixture weights, the argmax step, the entropy / log T, and per step
    the mean weight and the share of tokens whose argmax it is."""
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


def draw_pictures(model, units: Sequence[int], paths: Sequence[Optional[str]], names: Sequence[str], size: int,
                  keep_aspect: bool, out_dir: str, amp: bool = False, device: str = "cpu") -> Iterator[dict]:
    """Draw each image (``paths``: files, None: the astronaut photo) to ``out_dir/NAME_mixture.png``
    (``names``: ``picture_names(paths)``); yields dict(path, png, size, panels, units: ``mixture_stats``)."""
    os.makedirs(out_dir, exist_ok=True)
    for path, name in zip(paths, names):
        image = load_image(path, size, keep_aspect, model.patch_size)
        stats = mixture_stats(model, to_batch(image), units, amp, device)
        png = os.path.join(out_dir, f"{name}_mixture.png")
        titles = plot_image(model, image, stats, png, os.path.basename(path) if path is not None else "astronaut")
        yield dict(path=path, png=png, size=image.shape[:2], panels=titles, units=stats)


def draw_summary(model, images: Sequence[dict], out_dir: str) -> Tuple[Stats, str, int]:
    """(per unit the mean weight and argmax share per step over all tokens of ``draw_pictures``'
    ``images``, ``out_dir/summary.png`` that draws them, the tokens per unit)."""
    sums, tokens = {}, 0
    for image in images:
        n = next(iter(image["units"].values()))["argmax"].numel()
        for i, s in image["units"].items():
            total = torch.stack([s["mean_weight"], s["argmax_share"]]) * n
            sums[i] = total if i not in sums else sums[i] + total
        tokens += n
    summary = {i: dict(mean_weight=total[0] / tokens, argmax_share=total[1] / tokens) for i, total in sums.items()}
    fig = Figure(figsize=(3.6 * len(summary), 3.4), layout="constrained")
    for k, (ax, (i, s)) in enumerate(zip(fig.subplots(1, len(summary), squeeze=False)[0], summary.items())):
        draw_bars(ax, s["mean_weight"], s["argmax_share"], unit_label(model, i), k == 0)
    fig.suptitle(f"weight per step over {len(images)} image(s), {tokens} tokens per unit")
    fig.savefig(os.path.join(out_dir, "summary.png"), dpi=100, bbox_inches="tight")
    return summary, os.path.join(out_dir, "summary.png"), tokens


def describe_image(image: dict) -> str:
    """One line of a ``draw_pictures`` result: its size, each unit's mean weight per step."""
    height, width = image["size"]
    return f"{width}x{height}, mean weight per step " + "; ".join(
        f"unit {i} " + "/".join(f"{w:.2f}" for w in s["mean_weight"].tolist()) for i, s in image["units"].items())


def describe_summary(model, summary: Stats) -> str:
    """A line per unit of ``draw_summary``'s statistics."""
    return "\n".join(f"  {unit_label(model, i)}: mean weight per step " + " ".join(f"{w:.3f}" for w in s["mean_weight"])
                     + ", argmax share " + " ".join(f"{w:.3f}" for w in s["argmax_share"]) for i, s in summary.items())


def step_colors(steps: int) -> ListedColormap:
    """A discrete colormap, one colour per step."""
    if steps <= 10:
        return ListedColormap([colormaps["tab10"](t) for t in range(steps)])
    return ListedColormap(colormaps["viridis"](np.linspace(0, 1, steps)))


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


def plot_image(model, image: np.ndarray, stats: Stats, out: str, name: str) -> List[str]:
    """One row per unit: argmax step, entropy, weight per step. Returns the panel titles."""
    height, width = image.shape[:2]
    extent = (0, width, height, 0)  # each token covers its patch
    fig = Figure(figsize=(3 * width / height * 2 + 3.5, 3.3 * len(stats)), layout="constrained")
    axes = fig.subplots(len(stats), 3, squeeze=False, gridspec_kw=dict(width_ratios=[width / height] * 2 + [1]))
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
    return [ax.get_title() for ax in axes.flat]

