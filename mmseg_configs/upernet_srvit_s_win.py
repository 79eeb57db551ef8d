# SR-ViT-S T=3 with ViTDet-style attention, the core's arguments as in the detectron2 _win
# configs: 8x8 windows (the 32x32 grid of a 512 crop in 4x4 windows), global attention in the
# first application of every recursive unit, decomposed relative positions (zero-initialised,
# no weight decay). The ImageNet checkpoint loads as is: its class token is dropped.
_base_ = './upernet_srvit_s.py'
model = dict(backbone=dict(window_size=8, use_rel_pos=True))
