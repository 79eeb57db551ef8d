"""SR-ViT-B T=3 with ViTDet's windows, Cascade Mask R-CNN: ../mask_rcnn_srvit_b_t3_win.py (backbone, recipe, schedule,
layer decay, checkpoint) with ViTDet's three cascade stages in place of the box head (common/cascade_heads.py),
as ViTDet's cascade_mask_rcnn_vitdet_b_100ep.py builds on its Mask R-CNN config."""
from ..common.cascade_heads import cascade_roi_heads as _cascade_roi_heads
from ..common.cascade_heads import mask_rcnn_only as _mask_rcnn_only
from ..mask_rcnn_srvit_b_t3_win import dataloader, lr_multiplier, model, optimizer, train

[model.roi_heads.pop(k) for k in _mask_rcnn_only]
model.roi_heads.update(_cascade_roi_heads)
