_base_ = './_base_/upernet_srvit_mln_160k_ade20k.py'
embed_dim = 512  # SR-ViT-B width: neck and heads follow
model = dict(
    backbone=dict(variant='srvit_b_t3',
                  init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_b_t3_in1k.pth')),
    neck=dict(in_channels=[embed_dim] * 4, out_channels=embed_dim),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
