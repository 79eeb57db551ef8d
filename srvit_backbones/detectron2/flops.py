"""A detectron2 detector's Table 4 row (tools/count_flops.py, ``Detectron2Adapter.count_flops``)."""
import copy

import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.utils.analysis import FlopCountAnalysis
from omegaconf import OmegaConf

from ..analysis.flops import Counted, attention_split, count_by_operator, count_params, count_parts, proposals_checked
from ..analysis.flops_table import table_row
from .demo import set_score_threshold


def _proposals(model):
    """``proposals_checked`` for a detectron2 detector: the RPN's output counted."""
    rpn = model.proposal_generator
    return proposals_checked(rpn, "nms_thresh", rpn, lambda args, output: len(output[0][0]), rpn.post_nms_topk[False])


def count_detector(path: str, counted: Counted, plain: bool = False) -> dict:
    """The Table 4 row of the LazyConfig ``path`` on a square-pad-sized image, by ``count_parts``
    (``plain``: one trace of the whole model)."""
    cfg = LazyConfig.load(path)
    side = int(cfg.model.backbone.get("square_pad") or 1024)
    torch.manual_seed(0)
    set_score_threshold(cfg, 1.01)  # nothing detected: the mask head is not counted
    model = instantiate(cfg.model).eval()
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
