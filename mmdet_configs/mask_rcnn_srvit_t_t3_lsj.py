# SR-ViT-T T=3: the main recipe with another variant and its checkpoint
_base_ = './_base_/mask_rcnn_srvit_sfp_lsj_270k_coco.py'
model = dict(backbone=dict(
    variant='srvit_t_t3',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_t_t3_in1k.pth')))
