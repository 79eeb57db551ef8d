_base_ = './_base_/upernet_srvit_b_mln_160k_ade20k.py'
model = dict(backbone=dict(
    variant='srvit_b_t2',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_b_t2_in1k.pth')))
