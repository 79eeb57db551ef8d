#!/usr/bin/env python
"""Picture the soft router's mixture weights, like the paper's Figure 4: for one recursive
unit, each recursion step's weight map over the image and the blended map (the expected
step, sum_t t * alpha_t).

    python tools/visualize_mixture.py --model srvit_s_t3 --checkpoint output/pretrain/best.pth --unit 1
    python tools/visualize_mixture.py --image photo.jpg --out mixture.png

Without --image, a real photograph shipped with scikit-image is used. Without
--checkpoint, the model is random (its router initialised non-zero so the maps vary).
"""
import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # noqa: E402

from srvit_backbones import create_srvit, load_pretrained  # noqa: E402


def load_image(path, size):
    if path:
        image = Image.open(path).convert("RGB")
    else:
        from skimage import data

        image = Image.fromarray(data.astronaut())
    return np.array(image.resize((size, size), Image.BICUBIC))


def mixture_maps(model, image, unit):
    x = torch.from_numpy(image).permute(2, 0, 1).float().div(255)
    x = (x - torch.tensor(IMAGENET_DEFAULT_MEAN)[:, None, None]) / torch.tensor(IMAGENET_DEFAULT_STD)[:, None, None]
    with torch.no_grad():
        feats = model.eval().forward_feature_maps(x[None], indices=[unit], return_mixture=True)
    key = f"mixture{unit}"
    if key not in feats:
        raise SystemExit(f"unit {unit} has no soft router (an ordinary block, T=1 or 'last' aggregation); "
                         f"recursive units: {list(model.recursive_unit_indices)}")
    return feats[key][0]  # (T, h, w)


def plot(image, weights, unit, out):
    steps = weights.shape[0]
    up = F.interpolate(weights[None], size=image.shape[:2], mode="bilinear", align_corners=False)[0].numpy()
    expected = (np.arange(1, steps + 1)[:, None, None] * up).sum(0)
    fig, axes = plt.subplots(1, steps + 2, figsize=(3 * (steps + 2), 3.2))
    axes[0].imshow(image)
    axes[0].set_title("input")
    for t in range(steps):
        axes[t + 1].imshow(image)
        im = axes[t + 1].imshow(up[t], cmap="viridis", alpha=0.6, vmin=0, vmax=1)
        axes[t + 1].set_title(f"unit {unit}, step {t + 1}")
    axes[-1].imshow(image)
    axes[-1].imshow(expected, cmap="magma", alpha=0.6, vmin=1, vmax=steps)
    axes[-1].set_title("blended (expected step)")
    for ax in axes:
        ax.axis("off")
    fig.colorbar(im, ax=axes[1:steps + 1].tolist(), fraction=0.02)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="srvit_s_t3")
    parser.add_argument("--checkpoint", default="", help="pretraining checkpoint (default: random model)")
    parser.add_argument("--image", default="", help="image file (default: scikit-image's astronaut photo)")
    parser.add_argument("--unit", type=int, default=1, help="recursive unit index (1 = the first, R4 for S/B)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--out", default="mixture.png")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    model = create_srvit(args.model, num_classes=0, img_size=args.size, zero_init_recursion=bool(args.checkpoint))
    if args.checkpoint:
        load_pretrained(model, args.checkpoint)
    image = load_image(args.image, args.size)
    weights = mixture_maps(model, image, args.unit)
    plot(image, weights, args.unit, args.out)
    print(f"wrote {args.out}: unit {args.unit}, {weights.shape[0]} steps, {weights.shape[1]}x{weights.shape[2]} tokens")
    return weights


if __name__ == "__main__":
    main()
