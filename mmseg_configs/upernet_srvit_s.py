# SR-ViT-S, T=3 (the main model): python tools/train_seg.py mmseg_configs/upernet_srvit_s.py
_base_ = './_base_/upernet_srvit_mln_160k_ade20k.py'
model = dict(backbone=dict(
    variant='srvit_s_t3',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_s_t3_in1k.pth')))
