"""An mmdet detector's Table 4 row (tools/count_flops.py, ``MMDetAdapter.count_flops``)."""

import torch
import torch.nn as nn
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.utils import register_all_modules
from mmengine.config import Config

from ..analysis.flops import Counted, attention_split, count_by_operator, count_params, count_parts, proposals_checked
from ..analysis.flops_table import table_row


class _Predict(nn.Module):
    """An mmdet detector's ``predict`` on one padded image, as a module fvcore can trace."""

    def __init__(self, model, side):
        super().__init__()
        self.model = model
        self.samples = [DetDataSample(metainfo=dict(img_shape=(side, side), ori_shape=(side, side),
                                                    pad_shape=(side, side), batch_input_shape=(side, side),
                                                    scale_factor=(1.0, 1.0)))]

    def forward(self, x):
        result = self.model.predict(x, self.samples, rescale=False)[0].pred_instances
        return result.bboxes, result.scores


def _proposals(predict):
    """``proposals_checked`` for an mmdet detector: the rois of the first stage's box head counted."""
    model, extractor = predict.model, predict.model.roi_head.bbox_roi_extractor
    first = extractor[0] if isinstance(extractor, nn.ModuleList) else extractor
    return proposals_checked(model.rpn_head.test_cfg.nms, "iou_threshold", first, lambda args, output: len(args[1]),
                             model.rpn_head.test_cfg.max_per_img)


def count_detector(path: str, counted: Counted, plain: bool = False) -> dict:
    """The Table 4 row of the mmdet config ``path``: its ``predict`` on a square image of the test
    resize's size, by ``count_parts`` (``plain``: one trace)."""
    register_all_modules()
    cfg = Config.fromfile(path)
    resize = next((t for t in cfg.test_dataloader.dataset.pipeline if t.type == "Resize"), None)
    side = int(max(resize.scale)) if resize is not None and resize.get("scale") else 1024
    cfg.model.backbone.pop("init_cfg", None)
    cfg.model.test_cfg.rcnn.score_thr = 1.01  # nothing detected: the mask head is not counted
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    predict, x = _Predict(model, side), torch.zeros(1, 3, side, side)
    if plain:
        counts = count_by_operator(predict, (x,))
    else:
        heads = repr({k: v for k, v in cfg.model.to_dict().items() if k != "backbone"})
        counts = count_parts(predict, (x,), "model.backbone", x, heads, counted, heads_counted=_proposals)
    full, attention = attention_split(counts)
    params = count_params(model)
    return table_row(path, "detection", (side, side), params, params, full - attention, full - attention, full)
