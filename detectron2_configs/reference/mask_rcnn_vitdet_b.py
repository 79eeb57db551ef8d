"""detectron2's own ViTDet ViT-B Mask R-CNN: the model and optimizer of detectron2's
projects/ViTDet/configs/COCO/mask_rcnn_vitdet_b_100ep.py, built from its model zoo
(common/models/mask_rcnn_vitdet.py; nothing of this project in the model), with our LSJ data and
training settings. The anchor our detectors are timed beside, in one command:

    python tools/benchmark.py --detector reference/mask_rcnn_vitdet_b.py mask_rcnn_srvit_s_t3_win.py

Not a recipe of this project: ViTDet starts from an MAE ViT-B checkpoint
(detectron2://ImageNetPretrained/MAE/mae_pretrain_vit_base.pth?matching_heuristics=True).
"""
from functools import partial

from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.modeling.backbone.vit import get_vit_lr_decay_rate
from detectron2.solver import WarmupParamScheduler
from fvcore.common.param_scheduler import MultiStepParamScheduler

from ..common.coco_loader_lsj import dataloader  # noqa: F401  (the config's data)

model = model_zoo.get_config("common/models/mask_rcnn_vitdet.py").model

train = model_zoo.get_config("common/train.py").train
train.amp.enabled = True
train.ddp.fp16_compression = True
train.init_checkpoint = ""
train.max_iter = 184375  # 100 epochs at batch 64

lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(MultiStepParamScheduler)(values=[1.0, 0.1, 0.01], milestones=[163889, 177546],
                                         num_updates=train.max_iter),
    warmup_length=250 / train.max_iter,
    warmup_factor=0.001,
)

optimizer = model_zoo.get_config("common/optim.py").AdamW
optimizer.params.lr_factor_func = partial(get_vit_lr_decay_rate, num_layers=12, lr_decay_rate=0.7)
optimizer.params.overrides = {"pos_embed": {"weight_decay": 0.0}}
