"""Mask R-CNN with an SR-ViT backbone and ViTDet's Simple Feature Pyramid: the paper's COCO
recipe (SPEC section 4). Variant files change only the backbone and the checkpoint.

- LSJ, 1024x1024 crops, total batch 16, 3x schedule = 270k iterations
- AdamW lr 1e-4, cosine decay, 1000-iteration linear warmup
- layer-wise lr decay 0.7 by the shared-block rule (srvit_backbones.layer_decay); weight
  decay 0.1, none on norms and positions (detectron2's ViTDet convention)
- mixed precision; the backbone's position embedding is a full 64x64 table at 1024 input,
  resized from the 14x14 pretraining table when the checkpoint loads.
"""
from detectron2 import model_zoo
from detectron2.config import LazyCall as L
from detectron2.solver import WarmupParamScheduler
from fvcore.common.param_scheduler import CosineParamScheduler

from srvit_backbones.detectron2 import SRViTBackbone, srvit_optimizer_params

from .coco_loader_lsj import dataloader, image_size

model = model_zoo.get_config("common/models/mask_rcnn_vitdet.py").model
model.backbone.net = L(SRViTBackbone)(
    variant="srvit_s_t3",
    img_size=image_size,
    out_features=["last_feat"],
    drop_path_rate=0.1,
    use_act_checkpoint=False,
    # train.init_checkpoint (a pretraining checkpoint): take its EMA weights when present;
    # a checkpoint that lacks backbone weights is a CheckpointError naming them, unless
    # allow_partial=True (the missing ones keep their initialisation and are logged).
    prefer_ema=False,
    allow_partial=False,
    # torch.compile the backbone in training and inference: True (inductor), or a dict of
    # torch.compile's arguments, e.g. model.backbone.net.compile={mode:max-autotune}. The
    # heads stay eager (their shapes depend on the data).
    compile=False,
)
model.backbone.in_feature = "last_feat"
model.backbone.square_pad = image_size

train = model_zoo.get_config("common/train.py").train
train.amp.enabled = True
train.ddp.fp16_compression = True
train.max_iter = 270000
train.eval_period = 10000
train.checkpointer.period = 10000
# An ImageNet checkpoint from tools/pretrain.py (or a timm DeiT one for the baseline);
# variant files name theirs, "" trains from scratch.
train.init_checkpoint = ""

lr_multiplier = L(WarmupParamScheduler)(
    scheduler=L(CosineParamScheduler)(start_value=1.0, end_value=0.0),
    warmup_length=1000 / train.max_iter,
    warmup_factor=0.001,
)

optimizer = model_zoo.get_config("common/optim.py").AdamW
optimizer.lr = 1e-4
# Layer decay by the unit sizes of the backbone as built (variant, layout, num_steps
# overrides followed). Weight decay as detectron2's ViTDet: none on norms (weight_decay_norm=0)
# nor on the core's no_weight_decay() names (position table, tokens, rel-pos tables); biases
# take it (srvit_backbones/layer_decay.py, WEIGHT_DECAY_CONVENTIONS).
# tools/train_net.py sets optimizer.params.model, as detectron2's lazyconfig_train_net does.
optimizer.params = L(srvit_optimizer_params)(base_lr="${..lr}", lr_decay=0.7, weight_decay_convention="norms")
