"""SR-ViT-S T=3 with ViTDet's windows, Cascade Mask R-CNN on LVIS v1: ../cascade/cascade_mask_rcnn_srvit_s_t3_win.py
with ViTDet's LVIS settings (common/lvis.py) in each of the three stages' box predictors, as
lvis/mask_rcnn_srvit_s_t3_win.py has them in its one."""
from ..cascade.cascade_mask_rcnn_srvit_s_t3_win import lr_multiplier, model, optimizer, train
from ..common.lvis import dataloader
from ..common.lvis import lvis_box_predictor as _lvis_box_predictor
from ..common.lvis import lvis_schedule as _lvis_schedule
from ..common.lvis import num_classes as _num_classes

model.roi_heads.num_classes = _num_classes
[predictor.update(_lvis_box_predictor) for predictor in model.roi_heads.box_predictors]
_lvis_schedule(train, lr_multiplier, optimizer)
