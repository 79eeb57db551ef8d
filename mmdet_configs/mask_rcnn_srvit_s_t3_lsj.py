# SR-ViT-S, T=3 (the main model): mim train mmdet mmdet_configs/mask_rcnn_srvit_s_t3_lsj.py
_base_ = './_base_/mask_rcnn_srvit_sfp_lsj_270k_coco.py'
model = dict(backbone=dict(
    variant='srvit_s_t3',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_s_t3_in1k.pth')))  # from tools/pretrain.py
