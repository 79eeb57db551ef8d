# SR-ViT + Multi-Level Neck + UPerNet on ADE20K, the paper's recipe (SPEC section 5):
# 160k iterations, AdamW lr 6e-5, weight decay 0.01, poly decay after a 1500-iteration
# linear warmup, 512x512 crops, batch 2 per GPU x 8 GPUs = 16. Variant configs override
# only the backbone (and the widths when the embedding dim changes).
_base_ = [
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
custom_imports = dict(imports=['srvit_backbones.mmseg'], allow_failed_imports=False)

crop_size = (512, 512)
embed_dim = 384
norm_cfg = dict(type='SyncBN', requires_grad=True)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=crop_size,
    # SR-ViT takes sides that are multiples of its patch size: test images are padded
    # (and the prediction cropped back) instead of being resized
    test_cfg=dict(size_divisor=16))
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='SRViT',
        variant='srvit_s_t3',
        img_size=crop_size,
        out_indices=None,  # the four recursive units (R4, R3, R2, R1)
        drop_path_rate=0.1,
        with_cp=False,
        # torch.compile the backbone: True (inductor) or torch.compile's arguments, e.g.
        # dict(mode='max-autotune'); the neck and heads stay eager
        compile=False,
        interpolate_mode='bicubic'),  # variant configs add init_cfg=dict(type='Pretrained', ...)
    # Neck and head widths as in the paper's Table 4 model sizes: MLN out_channels = the
    # backbone width and 256-channel UPerHead/FCN heads give the paper's 36.9M for DeiT-S
    # (mmseg's stock 512-channel UPerHead would give 58.0M).
    neck=dict(type='MultiLevelNeck', in_channels=[embed_dim] * 4, out_channels=embed_dim,
              scales=[4, 2, 1, 0.5]),
    decode_head=dict(
        type='UPerHead',
        in_channels=[embed_dim] * 4,
        in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6),
        channels=256,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)),
    auxiliary_head=dict(
        type='FCNHead',
        in_channels=embed_dim,
        in_index=3,
        channels=256,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4)),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'))

# AdamW with the shared-block layer-wise lr decay constructor. The paper does not decay
# the lr per layer on ADE20K (layer_decay_rate=1.0); set e.g. 0.9 to enable it. Weight decay as
# mmseg's ViT UPerNet configs (custom_keys norm / pos_embed / cls_token: decay_mult=0): none on
# norms nor on the core's positions and tokens; biases take it (srvit_backbones/layer_decay.py).
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor='SRViTLayerDecayOptimizerConstructor',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(layer_decay_rate=1.0, weight_decay_convention='norms'))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]
train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
# faults (docs/faults.md): checkpoints written whole or not at all, a diverged run stopped
default_hooks = dict(checkpoint=dict(type='SRViTCheckpointHook'))
custom_hooks = [dict(type='DivergenceCheckHook')]
# the collective timeout and torchrun on machines without a GPU, also in mmseg's own tools/train.py
runner_type = 'SRViTRunner'
