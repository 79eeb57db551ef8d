# SR-ViT-S T=4: the main recipe with another variant and its checkpoint
_base_ = './_base_/mask_rcnn_srvit_sfp_lsj_270k_coco.py'
model = dict(backbone=dict(
    variant='srvit_s_t4',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_s_t4_in1k.pth')))
