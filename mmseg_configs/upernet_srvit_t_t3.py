_base_ = './_base_/upernet_srvit_mln_160k_ade20k.py'
model = dict(backbone=dict(
    variant='srvit_t_t3',
    out_indices=(1, 2, 3, 4),  # R3, R2, R1 and the last block: SR-ViT-T has three recursive units
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_t_t3_in1k.pth')))
