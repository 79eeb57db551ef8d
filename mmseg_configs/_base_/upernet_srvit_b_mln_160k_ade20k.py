# SR-ViT-B: the ADE20K recipe with the neck and heads at the backbone's width 512.
_base_ = './upernet_srvit_mln_160k_ade20k.py'
embed_dim = 512
model = dict(
    neck=dict(in_channels=[embed_dim] * 4, out_channels=embed_dim),
    decode_head=dict(in_channels=[embed_dim] * 4),
    auxiliary_head=dict(in_channels=embed_dim))
