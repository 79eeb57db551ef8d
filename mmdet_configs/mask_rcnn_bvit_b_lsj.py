# bViT-B (one ViT-B block applied 12 times, 8.6M backbone parameters) in the same recipe: the
# pyramid takes the last step's output, as ViTDet's takes its last block's
_base_ = './_base_/mask_rcnn_srvit_sfp_lsj_270k_coco.py'
embed_dim = 768
model = dict(
    backbone=dict(
        variant='bvit_b',
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/bvit_b_in1k.pth')),  # tools/pretrain.py --model bvit_b
    neck=dict(in_channels=embed_dim))
