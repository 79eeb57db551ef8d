"""detectron2's own ViTDet ViT-B Cascade Mask R-CNN: reference/mask_rcnn_vitdet_b.py with ViTDet's
three cascade stages (common/cascade_heads.py), as detectron2's
projects/ViTDet/configs/COCO/cascade_mask_rcnn_vitdet_b_100ep.py builds on its Mask R-CNN config.
The anchor of the cascade detectors' counts and timings:

    python tools/count_flops.py --task detection --configs reference/cascade_mask_rcnn_vitdet_b.py cascade/
    python tools/benchmark.py --detector reference/cascade_mask_rcnn_vitdet_b.py \\
        cascade/cascade_mask_rcnn_srvit_s_t3_win.py
"""
from ..common.cascade_heads import cascade_roi_heads as _cascade_roi_heads
from ..common.cascade_heads import mask_rcnn_only as _mask_rcnn_only
from .mask_rcnn_vitdet_b import dataloader, lr_multiplier, model, optimizer, train

[model.roi_heads.pop(k) for k in _mask_rcnn_only]
model.roi_heads.update(_cascade_roi_heads)
