"""SR-ViT-B T=2 Mask R-CNN with ViTDet's 14x14 window attention and relative positions
(common/vitdet_window.py); otherwise mask_rcnn_srvit_b_t2.py: recipe, variant and checkpoint."""
from .common.vitdet_window import vitdet_window as _vitdet_window
from .mask_rcnn_srvit_b_t2 import dataloader, lr_multiplier, model, optimizer, train

model.backbone.net.update(_vitdet_window)
