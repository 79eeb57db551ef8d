# The DeiT-S baseline (T=1) through the same SR-ViT code, from a timm DeiT-S state dict
_base_ = './_base_/mask_rcnn_srvit_sfp_lsj_270k_coco.py'
model = dict(backbone=dict(
    variant='srvit_deit_s',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/deit_small_patch16_224.pth')))
