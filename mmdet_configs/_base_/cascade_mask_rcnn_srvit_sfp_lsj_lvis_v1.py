# Cascade Mask R-CNN on LVIS v1: the LVIS Mask R-CNN recipe (mask_rcnn_srvit_sfp_lsj_lvis_v1.py) with
# ViTDet's three cascade stages, each with LVIS's box predictor (vitdet_cascade_heads.py).
_base_ = ['./mask_rcnn_srvit_sfp_lsj_lvis_v1.py', './vitdet_cascade_heads.py']
model = dict(
    roi_head={{_base_.vitdet_cascade_roi_head_lvis}},
    train_cfg=dict(rcnn={{_base_.vitdet_cascade_rcnn_train_cfg}}))
