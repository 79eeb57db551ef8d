# SR-ViT-B T=2 (width 512): the pyramid takes a 512-channel map
_base_ = './_base_/mask_rcnn_srvit_sfp_lsj_270k_coco.py'
embed_dim = 512
model = dict(
    backbone=dict(
        variant='srvit_b_t2',
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_b_t2_in1k.pth')),
    neck=dict(in_channels=embed_dim))
