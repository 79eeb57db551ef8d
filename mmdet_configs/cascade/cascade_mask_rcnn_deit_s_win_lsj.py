# The DeiT-S baseline with ViTDet's windows, Cascade Mask R-CNN on COCO: the recipe
# _base_/cascade_mask_rcnn_srvit_sfp_lsj_270k_coco.py with the backbone of ../mask_rcnn_deit_s_win_lsj.py
# (a test checks that backbone and pyramid equal that config's)
_base_ = '../_base_/cascade_mask_rcnn_srvit_sfp_lsj_270k_coco.py'
model = dict(backbone=dict(
    variant='srvit_deit_s',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/deit_small_patch16_224.pth'),
    window_size=14, use_rel_pos=True, global_attn_indexes=None))
