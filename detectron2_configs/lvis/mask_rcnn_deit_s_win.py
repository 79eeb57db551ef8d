"""The DeiT-S baseline with ViTDet's windows, Mask R-CNN on LVIS v1: ../mask_rcnn_deit_s_win.py (backbone, recipe, layer
decay, checkpoint) with ViTDet's LVIS settings (common/lvis.py): repeat-factor sampling, LVISEvaluator,
1203 classes, sigmoid CE with the federated loss, score threshold 0.02, top 300, LVIS's epochs,
twice the COCO lr, ViTDet's LVIS eval period."""
from ..common.lvis import dataloader
from ..common.lvis import lvis_box_predictor as _lvis_box_predictor
from ..common.lvis import lvis_schedule as _lvis_schedule
from ..common.lvis import num_classes as _num_classes
from ..mask_rcnn_deit_s_win import lr_multiplier, model, optimizer, train

model.roi_heads.num_classes = _num_classes
model.roi_heads.box_predictor.update(_lvis_box_predictor)
_lvis_schedule(train, lr_multiplier, optimizer)
