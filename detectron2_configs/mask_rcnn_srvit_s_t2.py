from .common.mask_rcnn_srvit import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.variant = "srvit_s_t2"
train.init_checkpoint = "pretrained/srvit_s_t2_in1k.pth"  # from tools/pretrain.py
