from .common.mask_rcnn_srvit import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.variant = "srvit_t_t3"
train.init_checkpoint = "pretrained/srvit_t_t3_in1k.pth"  # from tools/pretrain.py
