"""Parameter and FLOP counting, fvcore-style (one multiply-add = one FLOP).

fvcore has no handle for ``aten::scaled_dot_product_attention``; ``sdpa_flop_jit`` counts
it as the two matmuls it replaces (q @ k^T and attn @ v), so fused attention is counted
like the explicit attention of the paper's models. ``attention_split`` keeps it apart, for
figures (the paper's Table 4 detectors) that were counted without it.
"""
import warnings
from typing import Any, List, Tuple

import torch
import torch.nn as nn

SDPA_OP = "aten::scaled_dot_product_attention"


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    from fvcore.nn.jit_handles import get_shape

    q, k, v = (get_shape(t) for t in inputs[:3])
    *batch, n_q, d = q
    n_k, d_v = k[-2], v[-1]
    b = 1
    for s in batch:
        b *= s
    return b * n_q * n_k * d + b * n_q * n_k * d_v


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def attention_split(analysis) -> Tuple[int, int]:
    """(all, fused attention) FLOPs of an fvcore ``FlopCountAnalysis`` (fvcore's, or
    detectron2's for its detectors), the fused attention counted by ``sdpa_flop_jit``.
    Runs the analysis' model once; call it in eval mode."""
    analysis.set_op_handle(SDPA_OP, sdpa_flop_jit)
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit deprecation, from fvcore's tracer
        by_operator = analysis.by_operator()
    return int(sum(by_operator.values())), int(by_operator.get(SDPA_OP.split("::")[1], 0))


def count_flops(model: nn.Module, inputs: Tuple[torch.Tensor, ...]) -> int:
    """Total FLOPs (multiply-adds) of ``model(*inputs)`` in eval mode, via fvcore."""
    from fvcore.nn import FlopCountAnalysis

    was_training = model.training
    model.eval()
    try:
        return attention_split(FlopCountAnalysis(model, inputs))[0]
    finally:
        model.train(was_training)
