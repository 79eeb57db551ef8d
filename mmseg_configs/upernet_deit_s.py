# The DeiT-S baseline (T=1) through the same SR-ViT code; features of layers 3/6/9/12.
_base_ = './_base_/upernet_srvit_mln_160k_ade20k.py'
model = dict(backbone=dict(
    variant='srvit_deit_s',
    out_indices=(2, 5, 8, 11),
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/deit_small_patch16_224.pth')))
