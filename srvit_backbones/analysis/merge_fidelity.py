"""Token merging's effect on a trained backbone's dense features (tools/merge_fidelity.py): per merge
ratio, per-token cosine similarity and relative L2 error of each feature map against the unmerged's."""
from typing import Any, Dict, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..checkpoint import load_pretrained
from ..errors import CheckpointError
from ..models import create_srvit

#: {ratio: {feature: {"cosine": ..., "cosine_min": ..., "rel_l2": ...}}}
Fidelity = Dict[float, Dict[str, Dict[str, float]]]


def fidelity_model(variant: str, overrides: Sequence[Tuple[str, Any]], checkpoint: str, size: int) -> torch.nn.Module:
    """The variant (position table at ``size`` unless ``overrides`` set it) in eval mode with ``checkpoint``'s backbone.

    Raises:
        CheckpointError: backbone tensors are missing (another variant's checkpoint) or do not fit."""
    kwargs = dict(overrides)
    kwargs.setdefault("img_size", size)
    model = create_srvit(variant, num_classes=0, **kwargs).eval()
    # the dense features are taken before the final norm, which detector checkpoints lack
    report = load_pretrained(model, checkpoint, allow_partial=True)
    missing = [k for k in report.required_missing if not k.startswith("norm.")]
    if missing:
        raise CheckpointError(f"{checkpoint} does not fit {variant}: {len(missing)} backbone tensors are missing, "
                              f"e.g. {missing[:3]}; pass the variant (and --set overrides) it was trained with")
    return model


@torch.no_grad()
def fidelity(model, images: Sequence[torch.Tensor], ratios: Sequence[float]) -> Fidelity:
    """``Fidelity`` over ``images`` (each (1, 3, H, W)): mean per-token cosine, the lowest image's,
    ||merged - ref|| / ||ref||."""
    results = {}
    for ratio in ratios:
        sums = {}
        for x in images:
            model.set_token_merge_ratio(0.0)
            reference = model.forward_feature_maps(x)
            model.set_token_merge_ratio(ratio)
            merged = model.forward_feature_maps(x)
            for key, ref in reference.items():
                cosine = F.cosine_similarity(merged[key], ref, dim=1).mean().item()
                rel = ((merged[key] - ref).norm() / ref.norm()).item()
                sums.setdefault(key, []).append((cosine, rel))
        results[ratio] = {key: dict(cosine=float(np.mean([c for c, _ in v])), cosine_min=min(c for c, _ in v),
                                    rel_l2=float(np.mean([r for _, r in v]))) for key, v in sums.items()}
    model.set_token_merge_ratio(0.0)
    return results


def fidelity_table(results: Fidelity) -> str:
    """``fidelity``'s results as a markdown table, a row per ratio and feature."""
    rows = ["| ratio | feature | cosine (mean) | cosine (worst image) | relative L2 |", "|---|---|---|---|---|"]
    rows += [f"| {ratio} | {key} | {r['cosine']:.4f} | {r['cosine_min']:.4f} | {r['rel_l2']:.4f} |"
             for ratio, feats in results.items() for key, r in feats.items()]
    return "\n".join(rows)
