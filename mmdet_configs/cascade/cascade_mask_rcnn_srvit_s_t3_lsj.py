# SR-ViT-S T=3, Cascade Mask R-CNN on COCO: the recipe _base_/cascade_mask_rcnn_srvit_sfp_lsj_270k_coco.py
# with the backbone of ../mask_rcnn_srvit_s_t3_lsj.py
# (a test checks that backbone and pyramid equal that config's)
_base_ = '../_base_/cascade_mask_rcnn_srvit_sfp_lsj_270k_coco.py'
model = dict(backbone=dict(
    variant='srvit_s_t3',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_s_t3_in1k.pth')))  # from tools/pretrain.py
