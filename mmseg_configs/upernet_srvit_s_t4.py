_base_ = './_base_/upernet_srvit_mln_160k_ade20k.py'
model = dict(backbone=dict(
    variant='srvit_s_t4',
    init_cfg=dict(type='Pretrained', checkpoint='pretrained/srvit_s_t4_in1k.pth')))
