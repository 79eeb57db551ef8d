"""A detectron2 detector's parameters and FLOPs, whole (tools/count_flops.py --task detection,
the paper's Table 4; ``Detectron2Adapter.count_flops``): the conventions are
``srvit_backbones.flops_table``'s."""
import copy
from contextlib import contextmanager

import torch
import torch.nn as nn
from detectron2.config import LazyConfig, instantiate
from detectron2.utils.analysis import FlopCountAnalysis
from omegaconf import OmegaConf

from ..flops import Counted, attention_split, count_by_operator, count_params, count_parts, proposals_checked
from ..flops_table import table_row


@contextmanager
def _proposals(model):
    """``proposals_checked`` for a detectron2 detector: the RPN's output counted."""
    rpn, seen = model.proposal_generator, []

    def set_nms_threshold(value):
        rpn.nms_thresh, old = value, rpn.nms_thresh
        return old

    hook = rpn.register_forward_hook(lambda module, args, output: seen.append(len(output[0][0])))
    try:
        with proposals_checked(set_nms_threshold, lambda: seen[0] if seen else 0, rpn.post_nms_topk[False]):
            yield
    finally:
        hook.remove()


def count_detector(path: str, counted: Counted, plain: bool = False) -> dict:
    """The Table 4 row of the LazyConfig ``path``: Mask R-CNN (or cascade) on a square-pad-sized
    image, the FLOPs of one trace of the whole model (``plain``), or the same by ``count_parts``."""
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
                             repr(OmegaConf.to_container(heads)), counted, FlopCountAnalysis, _proposals)
    full, attention = attention_split(counts)
    params = count_params(model)
    return table_row(path, "detection", (side, side), params, params, full - attention, full - attention, full)
