# bViT-B (one ViT-B block applied 12 times): UPerNet over the outputs of steps 3, 6, 9 and 12,
# as DeiT-B's over its layers 3/6/9/12; neck and heads at the width 768.
_base_ = './_base_/upernet_srvit_mln_160k_ade20k.py'
embed_dim = 768
model = dict(
    backbone=dict(
        variant='bvit_b',
        init_cfg=dict(type='Pretrained', checkpoint='pretrained/bvit_b_in1k.pth')),
    neck=dict(in_channels=[embed_dim] * 4, out_channels=embed_dim),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
