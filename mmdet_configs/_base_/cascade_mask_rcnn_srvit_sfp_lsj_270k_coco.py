# Cascade Mask R-CNN: the Mask R-CNN recipe (mask_rcnn_srvit_sfp_lsj_270k_coco.py: backbone, pyramid,
# RPN, LN mask head, data, schedule, layer decay) with ViTDet's three cascade stages in place of its
# box head (vitdet_cascade_heads.py), as ViTDet's cascade config builds on its Mask R-CNN one.
_base_ = ['./mask_rcnn_srvit_sfp_lsj_270k_coco.py', './vitdet_cascade_heads.py']
model = dict(
    roi_head={{_base_.vitdet_cascade_roi_head}},
    train_cfg=dict(rcnn={{_base_.vitdet_cascade_rcnn_train_cfg}}))
