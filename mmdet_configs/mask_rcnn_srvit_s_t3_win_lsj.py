# mask_rcnn_srvit_s_t3_lsj.py with ViTDet's 14x14 window attention and decomposed relative positions.
# Global stay the core's default applications (global_attn_indexes=None: the first of every
# unit feeding the dense heads and the last; DeiT-S's 2, 5, 8, 11). The ImageNet checkpoint
# loads as is: its class token is dropped, the relative-position tables start at zero.
_base_ = './mask_rcnn_srvit_s_t3_lsj.py'
model = dict(backbone=dict(window_size=14, use_rel_pos=True, global_attn_indexes=None))
