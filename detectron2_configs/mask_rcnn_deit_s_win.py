"""The DeiT-S baseline as ViTDet runs it: 14x14 windows in all blocks but 2, 5, 8, 11, relative
positions (common/vitdet_window.py); otherwise mask_rcnn_deit_s.py: recipe and checkpoint."""
from .common.vitdet_window import vitdet_window as _vitdet_window
from .mask_rcnn_deit_s import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.update(_vitdet_window)
