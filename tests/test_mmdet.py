"""MMDetection: the SR-ViT backbone, the Simple Feature Pyramid, the layer-decay constructor and
the configs against detectron2's, and tools/train_det.py / test_det.py / mim / DetInferencer end
to end on synthetic COCO."""
import copy
import functools
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import timm
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from detectron2.config import LazyConfig, instantiate
from detectron2.modeling.backbone.fpn import LastLevelMaxPool
from detectron2.modeling.backbone.vit import SimpleFeaturePyramid as D2SimpleFeaturePyramid
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.structures.mask import BitmapMasks
from mmdet.utils import register_all_modules
from mmengine.config import Config
from mmengine.model import MMDistributedDataParallel
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmengine.structures import InstanceData
from PIL import Image

import srvit_backbones
import srvit_backbones.mmdet  # noqa: F401  (registers SRViT, SimpleFeaturePyramid, ...)
from helpers import (
    assert_layer_decay_constructor_honours_paramwise_cfg,
    assert_mmengine_compiled_training_equals_eager,
    assert_mmengine_resume_restores,
    assert_mmengine_run_stops_diverged,
    file_size_limit,
    free_port,
    kill_machine_1_beside_one_machine,
    load_tool,
    randomize_routers,
    run,
    scheduled_lrs,
    side_by_side,
    torchrun,
    trained_detectron2,
    two_gloo_processes,
)
from srvit_backbones import CheckpointError, ConfigError, DataCheckError, create_srvit
from srvit_backbones.detectron2 import SRViTBackbone as D2Backbone
from srvit_backbones.detectron2 import SRViTCheckpointer, srvit_optimizer_params
from srvit_backbones.layer_decay import lr_decay_factor
from srvit_backbones.models.rel_pos import is_rel_pos
from srvit_backbones.openmmlab.hooks import Fp16CompressionHook
from srvit_backbones.training import curves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, "mmdet_configs")
D2_CONFIGS = os.path.join(ROOT, "detectron2_configs")
# every shipped config (quickstart/ included), found by glob: a new one is covered unedited
# (Mask R-CNN; cascade/ and lvis/ have their own sweep, ZOO, below)
ZOO_FOLDERS = ("cascade", "lvis")
CONFIGS = sorted(p for p in glob.glob(os.path.join(CONFIG_DIR, "**", "*.py"), recursive=True)
                 if not {"_base_", *ZOO_FOLDERS} & set(os.path.relpath(p, CONFIG_DIR).split(os.sep)))
ZOO = sorted(p for folder in ZOO_FOLDERS for p in glob.glob(os.path.join(CONFIG_DIR, folder, "*.py")))
FLAGSHIP = os.path.join(CONFIG_DIR, "mask_rcnn_srvit_s_t3_lsj.py")
QUICKSTART = os.path.join(CONFIG_DIR, "quickstart", "mask_rcnn_srvit_tiny_cpu.py")
WIDTH, HEADS, SIZE, CHANNELS = 32, 2, 64, 32

register_all_modules()


@pytest.fixture(autouse=True)
def mmdet_scope():
    """Each test builds in mmdet's registries, whatever scope an earlier test's Runner or
    demo left current (mmengine's default scope is process-wide)."""
    with DefaultScope.overwrite_default_scope("mmdet"):
        yield


def config_name(path):
    return os.path.relpath(path, CONFIG_DIR)


def detectron2_twin(path):
    """The detectron2 config of the same variant and attention: mask_rcnn_X[_win]_lsj.py -> mask_rcnn_X[_win].py."""
    name = os.path.basename(path)
    twin = os.path.join(D2_CONFIGS, re.sub(r"_lsj\.py$", ".py", name))
    return twin if name.endswith("_lsj.py") and os.path.isfile(twin) else None


def shrink(cfg: Config) -> Config:
    """The config's detector at width 32, with 32-channel pyramid and heads, 64-pixel images,
    fp32 and no pretrained file; everything else (variant, layout, T, windows, out_indices,
    heads' types, losses, constructor) as shipped. A cascade's three box heads are shrunk alike."""
    model = cfg.model
    model.backbone.update(img_size=(SIZE, SIZE), embed_dim=WIDTH, num_heads=HEADS)
    model.backbone.pop("init_cfg", None)
    if model.backbone.get("window_size"):
        model.backbone.window_size = 2
    model.data_preprocessor.batch_augments = [dict(type="BatchFixedSizePad", size=(SIZE, SIZE), pad_mask=True)]
    model.data_preprocessor.pad_size_divisor = SIZE
    model.neck.update(in_channels=WIDTH, out_channels=CHANNELS)
    model.rpn_head.update(in_channels=CHANNELS, feat_channels=CHANNELS)
    roi = model.roi_head
    roi.bbox_roi_extractor.out_channels = roi.mask_roi_extractor.out_channels = CHANNELS
    for head in roi.bbox_head if isinstance(roi.bbox_head, list) else [roi.bbox_head]:
        head.update(in_channels=CHANNELS, conv_out_channels=CHANNELS, fc_out_channels=64)
    roi.mask_head.update(in_channels=CHANNELS, conv_out_channels=CHANNELS)
    for stage in model.train_cfg.rcnn if isinstance(model.train_cfg.rcnn, list) else [model.train_cfg.rcnn]:
        if "num" in stage.sampler:  # a cascade's later stages take every refined box (PseudoSampler)
            stage.sampler.num = 64
    cfg.optim_wrapper.type = "OptimWrapper"  # fp32 steps (mmengine's AmpOptimWrapper, built directly, asserts a GPU)
    return cfg


def batch(seed: int, n: int = 2) -> dict:
    """A data batch as mmdet's PackDetInputs makes it: uint8 images, boxes, labels and masks."""
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(n):
        inputs.append(torch.randint(0, 256, (3, SIZE, SIZE), dtype=torch.uint8, generator=g))
        sample = DetDataSample(metainfo=dict(img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE), pad_shape=(SIZE, SIZE),
                                             scale_factor=(1.0, 1.0), batch_input_shape=(SIZE, SIZE)))
        xy = torch.randint(0, SIZE // 2, (3, 2), generator=g).float()
        wh = torch.randint(8, SIZE // 2, (3, 2), generator=g).float()
        boxes = torch.cat([xy, xy + wh], dim=1)
        masks = torch.zeros(3, SIZE, SIZE, dtype=torch.uint8)
        for i, (x0, y0, x1, y1) in enumerate(boxes.long().tolist()):
            masks[i, y0:y1, x0:x1] = 1
        sample.gt_instances = InstanceData(bboxes=boxes, labels=torch.randint(0, 80, (3,), generator=g),
                                           masks=BitmapMasks(masks.numpy(), SIZE, SIZE))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def count(module):
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------------------- configs
def test_the_config_sweep_covers_every_variant_and_the_quickstart():
    names = {config_name(p) for p in CONFIGS}
    variants = ("s_t2", "s_t3", "s_t4", "b_t2", "b_t3")
    expected = {f"mask_rcnn_srvit_{v}{win}_lsj.py" for v in variants for win in ("", "_win")}
    expected |= {"mask_rcnn_deit_s_lsj.py", "mask_rcnn_deit_s_win_lsj.py", "mask_rcnn_bvit_b_lsj.py",
                 os.path.join("quickstart", "mask_rcnn_srvit_tiny_cpu.py")}
    assert expected <= names
    assert set(srvit_backbones.list_configs("mmdet")) == {n for n in names if os.sep not in n}


def test_flagship_holds_the_vitdet_recipe():
    cfg = Config.fromfile(FLAGSHIP)
    assert cfg.custom_imports.imports == ["srvit_backbones.mmdet"] and cfg.default_scope == "mmdet"
    assert cfg.model.type == "MaskRCNN" and cfg.model.backbone.type == "SRViT"
    assert cfg.model.backbone.variant == "srvit_s_t3" and cfg.model.backbone.img_size == (1024, 1024)
    assert cfg.model.neck == dict(type="SimpleFeaturePyramid", in_channels=384, out_channels=256,
                                  scale_factors=(4.0, 2.0, 1.0, 0.5), num_outs=5,
                                  norm_cfg=dict(type="LayerNorm2d", eps=1e-6, requires_grad=True))
    assert cfg.model.rpn_head.num_convs == 2
    assert cfg.model.roi_head.bbox_head.type == "Shared4Conv1FCBBoxHead"
    assert cfg.model.roi_head.bbox_head.norm_cfg.type == cfg.model.roi_head.mask_head.norm_cfg.type == "LayerNorm2d"
    steps = {t.type: t for t in cfg.train_pipeline}
    assert steps["RandomResize"].ratio_range == (0.1, 2.0) and steps["RandomResize"].scale == (1024, 1024)
    assert steps["RandomCrop"].crop_size == (1024, 1024) and steps["Pad"].size == (1024, 1024)
    # tested at ViTDet's 1024 square: resized into it (Pillow, as detectron2), padded by the preprocessor
    assert [(t.type, t.scale, t.backend) for t in cfg.test_pipeline if t.type in ("Resize", "Pad")] == \
        [("Resize", (1024, 1024), "pillow")]
    assert cfg.model.data_preprocessor.pad_size_divisor == 1024
    assert "FilterAnnotations" in steps
    assert cfg.optim_wrapper.type == "AmpOptimWrapper"
    assert cfg.optim_wrapper.constructor == "SRViTLayerDecayOptimizerConstructor"
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == 0.7
    assert cfg.optim_wrapper.optimizer == dict(type="AdamW", lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1)
    assert cfg.train_cfg.max_iters == 270000 and cfg.train_dataloader.batch_size == 2  # x 8 GPUs = 16
    warmup, cosine = cfg.param_scheduler
    assert (warmup.type, warmup.end, cosine.type, cosine.begin, cosine.end) == \
        ("LinearLR", 1000, "CosineAnnealingLR", 1000, 270000)
    assert cfg.custom_hooks == [dict(type="Fp16CompressionHook"), dict(type="DivergenceCheckHook")]
    assert cfg.default_hooks.checkpoint.type == "SRViTCheckpointHook"  # written whole or not at all
    # the detectron2 recipe, for the same variant
    d2 = LazyConfig.load(os.path.join(D2_CONFIGS, "mask_rcnn_srvit_s_t3.py"))
    assert (d2.train.max_iter, d2.optimizer.lr, d2.optimizer.weight_decay, d2.optimizer.params.lr_decay) == \
        (cfg.train_cfg.max_iters, cfg.optim_wrapper.optimizer.lr, cfg.optim_wrapper.optimizer.weight_decay,
         cfg.optim_wrapper.paramwise_cfg.layer_decay_rate)


@pytest.mark.parametrize("path", CONFIGS, ids=config_name)
def test_every_config_trains_one_step(path):
    """Every trainable parameter gets a gradient (DDP's find_unused_parameters=False needs it)
    and the config's optimizer constructor holds each exactly once."""
    cfg = shrink(Config.fromfile(path))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    backbone = model.backbone
    assert len(backbone.out_indices) == 1  # the pyramid's one map: the last block's output
    assert backbone.out_indices == [len(backbone.srvit.feature_points) - 1]

    data = model.data_preprocessor(batch(seed=0), training=True)
    losses = model(**data, mode="loss")
    assert {"loss_rpn_cls", "loss_cls", "loss_bbox", "loss_mask"} <= set(losses)
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert [name for name, p in trainable.items() if p.grad is None] == []
    assert all(torch.isfinite(p.grad).all() for p in trainable.values())

    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    grouped = [id(p) for group in wrapper.optimizer.param_groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in trainable.values())
    before = {name: p.detach().clone() for name, p in trainable.items()}
    wrapper.step()
    recursive = f"backbone.srvit.units.{backbone.srvit.recursive_unit_indices[0]}.blocks.0.attn.qkv.weight"
    assert not torch.equal(before[recursive], trainable[recursive])


@pytest.mark.parametrize("path", CONFIGS, ids=config_name)
def test_every_config_tests_at_its_padded_square(path):
    """ViTDet's test protocol: the image resized into the training square (long side), then padded
    to that square by the data preprocessor (not by a pipeline Pad, which would make the padding
    part of img_shape)."""
    cfg = Config.fromfile(path)
    side = cfg.model.backbone.img_size[0]
    (crop,) = [t.crop_size for t in cfg.train_pipeline if t.type == "RandomCrop"]
    for pipeline in (cfg.test_pipeline, cfg.test_dataloader.dataset.pipeline, cfg.val_dataloader.dataset.pipeline):
        assert [t.type for t in pipeline if t.type in ("Resize", "Pad")] == ["Resize"]
        (resize,) = [t for t in pipeline if t.type == "Resize"]
        assert resize.scale == crop == (side, side) and resize.keep_ratio and resize.backend == "pillow"
    assert cfg.model.data_preprocessor.pad_size_divisor == side


class BackboneReached(Exception):
    """Raised by a forward pre-hook once the backbone's input is recorded: the rest need not run."""


def backbone_input(backbone, run):
    """The tensor ``backbone`` is called with while ``run()`` runs."""
    seen = []

    def record(module, args):
        seen.append(args[0].detach().clone())
        raise BackboneReached

    handle = backbone.register_forward_pre_hook(record)
    try:
        with pytest.raises(BackboneReached):
            run()
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("path", [FLAGSHIP, QUICKSTART], ids=config_name)
def test_the_backbone_gets_detectron2s_padded_input(path, tmp_path):
    """One image through each framework's test path as its users run it (mmdet's
    inference_detector: the config's test pipeline and data preprocessor; detectron2's test
    DatasetMapper and the model's preprocess_image): the backbone gets the same tensor, the image
    resized into the square and padded to it with the mean pixel (0 once normalised)."""
    from detectron2.data import DatasetMapper
    from mmdet.apis import inference_detector, init_detector

    d2_path = detectron2_twin(path) or os.path.join(D2_CONFIGS, "quickstart", "mask_rcnn_srvit_tiny_cpu.py")
    image = tmp_path / "image.png"
    rng = torch.Generator().manual_seed(0)
    Image.fromarray(torch.randint(0, 256, (100, 150, 3), generator=rng, dtype=torch.uint8).numpy()).save(image)

    cfg = Config.fromfile(path)
    cfg.model.backbone.pop("init_cfg", None)
    side = cfg.model.backbone.img_size[0]
    model = init_detector(cfg, None, device="cpu")
    ours = backbone_input(model.backbone, lambda: inference_detector(model, str(image)))

    d2_cfg = LazyConfig.load(d2_path)
    d2_cfg.model.backbone.net.pop("init_checkpoint", None)
    d2_model = instantiate(d2_cfg.model).eval()
    mapper = instantiate(d2_cfg.dataloader.test.mapper)
    assert isinstance(mapper, DatasetMapper)
    sample = mapper(dict(file_name=str(image), height=100, width=150, image_id=0))
    with torch.no_grad():
        theirs = backbone_input(d2_model.backbone.net, lambda: d2_model([sample]))

    height = round(100 * side / 150)
    assert ours.shape == theirs.shape == (1, 3, side, side)
    assert torch.equal(ours, theirs)
    assert (ours[..., height:, :] == 0).all() and (ours[..., :height, :] != 0).any(-3).float().mean() > 0.9


def test_a_detection_in_the_padding_stays_in_the_image(tmp_path):
    """With the test images padded to the square, an untrained detector (its proposals all over the
    padded input) returns boxes clipped to the image and masks of the image's size: the pad is not
    part of img_shape (a pipeline Pad made boxes reach into it, and the mask paste then failed)."""
    from mmdet.apis import inference_detector, init_detector

    image = tmp_path / "wide.png"
    Image.fromarray(torch.full((40, 190, 3), 200, dtype=torch.uint8).numpy()).save(image)
    cfg = Config.fromfile(QUICKSTART)
    cfg.model.test_cfg.rcnn.update(score_thr=0.0, max_per_img=200)
    torch.manual_seed(0)
    model = init_detector(cfg, None, device="cpu")
    result = inference_detector(model, str(image))
    assert result.batch_input_shape == (192, 192) and result.img_shape == (40, 192) and result.ori_shape == (40, 190)
    boxes = result.pred_instances.bboxes
    assert len(boxes) > 50
    assert (boxes[:, [0, 2]] <= 190).all() and (boxes[:, [1, 3]] <= 40).all() and (boxes >= 0).all()
    assert result.pred_instances.masks.shape[-2:] == (40, 190)


TWINS = [p for p in CONFIGS if detectron2_twin(p)]


def test_every_paper_config_has_a_detectron2_twin():
    assert {config_name(p) for p in CONFIGS} - {config_name(p) for p in TWINS} == \
        {os.path.join("quickstart", "mask_rcnn_srvit_tiny_cpu.py")}


@pytest.mark.parametrize("path", TWINS, ids=config_name)
def test_backbone_and_pyramid_equal_detectron2s(path):
    """The same variant in both frameworks: backbone and pyramid of equal parameter counts,
    the backbone's tensors of the same names and shapes, windows where detectron2 has them
    (built on the meta device: shapes without values)."""
    cfg = Config.fromfile(path)
    cfg.model.backbone.pop("init_cfg")
    with torch.device("meta"):
        backbone, neck = MODELS.build(cfg.model.backbone), MODELS.build(cfg.model.neck)
        d2 = instantiate(LazyConfig.load(detectron2_twin(path)).model.backbone)
    assert count(backbone) == count(d2.net)
    assert count(neck) == count(d2) - count(d2.net)
    ours = {k: v.shape for k, v in backbone.srvit.state_dict().items()}
    assert ours == {k: v.shape for k, v in d2.net.srvit.state_dict().items()}
    assert backbone.srvit.window_size == d2.net.srvit.window_size
    assert [k for k in ours if is_rel_pos(k)] == [k for k in d2.net.srvit.state_dict() if is_rel_pos(k)]


def test_detector_parameters_equal_detectron2s():
    """The whole Mask R-CNN (RPN with 2 convs, 4conv1fc box head and mask head with LN) holds as
    many parameters as detectron2's ViTDet-style one: 47.1M for SR-ViT-S T=3 (the paper's Table 4)."""
    cfg = Config.fromfile(FLAGSHIP)
    cfg.model.backbone.pop("init_cfg")
    with torch.device("meta"):  # shapes without values
        ours = count(MODELS.build(cfg.model))
        theirs = count(instantiate(LazyConfig.load(os.path.join(D2_CONFIGS, "mask_rcnn_srvit_s_t3.py")).model))
    assert ours == theirs and round(ours / 1e6, 1) == 47.1


def test_pyramid_computes_detectron2s_simple_feature_pyramid():
    """Our SimpleFeaturePyramid with detectron2's weights gives detectron2's five maps."""
    torch.manual_seed(0)
    net = D2Backbone("srvit_t_t2", img_size=64, embed_dim=32, num_heads=2, drop_path_rate=0.0)
    d2 = D2SimpleFeaturePyramid(net, in_feature="last_feat", out_channels=16, scale_factors=(4.0, 2.0, 1.0, 0.5),
                                norm="LN", square_pad=64, top_block=LastLevelMaxPool()).eval()
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=64, embed_dim=32, num_heads=2,
                                 drop_path_rate=0.0))
    neck = MODELS.build(dict(type="SimpleFeaturePyramid", in_channels=32, out_channels=16,
                             norm_cfg=dict(type="LayerNorm2d")))
    neck.init_weights()
    backbone.srvit.load_state_dict(net.srvit.state_dict())
    theirs = [p for n, p in d2.named_parameters() if not n.startswith("net.")]
    mine = list(neck.parameters())
    assert [p.shape for p in mine] == [p.shape for p in theirs]
    with torch.no_grad():
        for p, q in zip(mine, theirs):
            q.normal_(0, 0.2)  # LayerNorms away from (1, 0), so that an unapplied norm shows
            p.copy_(q)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)  # float64: LayerNorms amplify float32 rounding
    with torch.no_grad():
        expected = d2.double()(x)
        got = neck.double()(backbone.double().eval()(x))
    assert [o.shape[-1] for o in got] == [16, 8, 4, 2, 1]
    for out, name in zip(got, ["p2", "p3", "p4", "p5", "p6"]):
        torch.testing.assert_close(out, expected[name], rtol=1e-4, atol=1e-5)


def test_the_roi_heads_pool_the_pyramid_as_torchvision_does():
    """The pyramid's maps are contiguous NCHW: mmcv's ``RoIAlign`` (CPU and CUDA) reads the
    input's memory as NCHW without making it contiguous, and a LayerNorm computed on a permuted
    view (NHWC in memory) made the RoI heads pool scrambled features (the box classifier of the
    quickstart then stalled at background). mmdet's RoI extractor, run on every level, equals
    torchvision's ``roi_align`` of the same level."""
    from mmdet.registry import MODELS as DET_MODELS
    from torchvision.ops import roi_align

    torch.manual_seed(0)
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=64, embed_dim=32, num_heads=2))
    neck = MODELS.build(dict(type="SimpleFeaturePyramid", in_channels=32, out_channels=16,
                             norm_cfg=dict(type="LayerNorm2d")))
    neck.init_weights()
    with torch.no_grad():
        maps = neck(backbone.eval()(torch.randn(2, 3, 64, 64)))
    assert all(m.is_contiguous() for m in maps)
    extractor = DET_MODELS.build(dict(type="SingleRoIExtractor", out_channels=16, featmap_strides=[4, 8, 16, 32],
                                      roi_layer=dict(type="RoIAlign", output_size=7, sampling_ratio=0)))
    rois = torch.tensor([[0, 4.0, 6.0, 30.0, 40.0], [1, 10.0, 2.0, 60.0, 50.0]])
    for level, stride in enumerate([4, 8, 16, 32]):
        got = extractor.roi_layers[level](maps[level], rois)
        expected = roi_align(maps[level], rois, 7, spatial_scale=1 / stride, sampling_ratio=0, aligned=True)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bad_pyramid_settings_are_explained():
    with pytest.raises(ValueError, match="scale factor 3.0 is not supported"):
        MODELS.build(dict(type="SimpleFeaturePyramid", in_channels=32, scale_factors=(3.0,)))
    with pytest.raises(ValueError, match="num_outs=3 is fewer than the 4 scale factors"):
        MODELS.build(dict(type="SimpleFeaturePyramid", in_channels=32, num_outs=3))


def test_layer_decay_and_weight_decay_follow_detectron2s_rule():
    """Each backbone parameter's lr factor is the one detectron2's optimizer gives it (the
    shared-block rule of srvit_backbones.layer_decay), heads get 1; the relative-position
    tables, position embedding, norms and biases get no weight decay."""
    path = os.path.join(CONFIG_DIR, "mask_rcnn_srvit_s_t3_win_lsj.py")
    cfg = Config.fromfile(path)
    cfg.model.backbone.update(img_size=(64, 64), embed_dim=32, num_heads=2, window_size=2)
    cfg.model.backbone.pop("init_cfg")
    cfg.optim_wrapper.type = "OptimWrapper"  # mmengine's AmpOptimWrapper asserts a GPU; the constructor is the same
    model = MODELS.build(cfg.model)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    names = {id(p): n for n, p in model.named_parameters()}
    scale, decay = {}, {}
    for group in wrapper.optimizer.param_groups:
        for p in group["params"]:
            scale[names[id(p)]], decay[names[id(p)]] = group["lr"] / 1e-4, group["weight_decay"]
    d2_cfg = LazyConfig.load(detectron2_twin(path))
    d2_cfg.model.backbone.net.update(img_size=64, embed_dim=32, num_heads=2, window_size=2)
    d2_model = instantiate(d2_cfg.model)
    d2_scale = {}
    for group in srvit_optimizer_params(d2_model, base_lr=1.0, lr_decay=0.7):
        for p in group["params"]:
            d2_scale[next(n for n, q in d2_model.named_parameters() if q is p)] = group["lr"]
    core = [n for n in scale if n.startswith("backbone.srvit.")]
    assert len(core) == sum(1 for n in d2_scale if n.startswith("backbone.net.srvit."))
    for name in core:
        d2_name = name.replace("backbone.srvit.", "backbone.net.srvit.")
        assert scale[name] == pytest.approx(d2_scale[d2_name]), name
        assert scale[name] == pytest.approx(lr_decay_factor(name, 0.7, [1, 4, 3, 2, 1, 1], "backbone.srvit.")), name
    assert len(set(round(s, 12) for s in scale.values())) == 14  # ids 0..13: embeddings, 12 blocks, heads
    assert all(scale[n] == 1.0 for n in scale if not n.startswith("backbone."))
    rel_pos = [n for n in core if is_rel_pos(n)]
    assert rel_pos and all(decay[n] == 0.0 for n in rel_pos + ["backbone.srvit.pos_embed"])
    assert all(decay[n] == 0.0 for n in scale if n.endswith(".bias") or ".norm" in n)
    assert decay["backbone.srvit.units.1.blocks.0.attn.qkv.weight"] == 0.1
    assert decay["roi_head.bbox_head.shared_fcs.0.weight"] == 0.1


def test_layer_decay_constructor_honours_mmengines_paramwise_cfg():
    cfg = Config.fromfile(QUICKSTART)
    assert_layer_decay_constructor_honours_paramwise_cfg(MODELS.build(cfg.model), cfg.optim_wrapper)


# ----------------------------------------------------------------------------- checkpoints
def test_pretraining_and_timm_checkpoints_load_into_the_backbone(tmp_path):
    """A tools/pretrain.py checkpoint (EMA on request, position table resized) and a timm DeiT
    state dict (blocks.i mapped onto the units) land in the mmdet backbone by value."""
    kw = dict(embed_dim=64, num_heads=2)
    weights, ema = randomize_routers(create_srvit("srvit_t_t2", **kw)), create_srvit("srvit_t_t2", **kw)
    path = str(tmp_path / "pre.pth")
    torch.save({"model": weights.state_dict(), "model_ema": ema.state_dict(), "epoch": 3}, path)
    for prefer_ema, source in ((False, weights), (True, ema)):
        backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=224, prefer_ema=prefer_ema,
                                     init_cfg=dict(type="Pretrained", checkpoint=path), **kw))
        backbone.init_weights()
        loaded, expected = backbone.srvit.state_dict(), source.state_dict()
        assert [k for k, v in loaded.items() if not torch.equal(v, expected[k])] == []

    deit = timm.create_model("deit_small_patch16_224", pretrained=False, num_classes=1000)
    path = str(tmp_path / "deit.pth")
    torch.save(deit.state_dict(), path)
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_deit_s", img_size=224,
                                 init_cfg=dict(type="Pretrained", checkpoint=path)))
    backbone.init_weights()
    core = backbone.srvit
    assert torch.equal(core.units[11].blocks[0].mlp.fc2.weight, deit.blocks[11].mlp.fc2.weight)
    assert torch.equal(core.units[0].blocks[0].attn.qkv.weight, deit.blocks[0].attn.qkv.weight)
    assert torch.equal(core.pos_embed, deit.pos_embed) and torch.equal(core.patch_embed.proj.weight,
                                                                         deit.patch_embed.proj.weight)

    wide = str(tmp_path / "wide.pth")
    torch.save({"model": create_srvit("srvit_t_t2", embed_dim=96, num_heads=2).state_dict()}, wide)
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=224,
                                 init_cfg=dict(type="Pretrained", checkpoint=wide), **kw))
    with pytest.raises(CheckpointError, match="width is 96, the model's 64"):
        backbone.init_weights()


def test_detectron2_model_final_loads_into_the_backbone(tmp_path_factory):
    """A detectron2 Mask R-CNN's model_final.pth gives the mmdet backbone its backbone, by value."""
    final = trained_detectron2(tmp_path_factory) / "out" / "model_final.pth"
    saved = torch.load(final, map_location="cpu", weights_only=True)["model"]
    prefix = "backbone.net.srvit."
    expected = {k[len(prefix):]: v for k, v in saved.items() if k.startswith(prefix)}
    backbone = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=128, embed_dim=64, num_heads=2,
                                 init_cfg=dict(type="Pretrained", checkpoint=str(final))))
    backbone.init_weights()
    loaded = backbone.srvit.state_dict()
    assert loaded.keys() == expected.keys()
    assert [k for k, v in expected.items() if not torch.equal(loaded[k], v)] == []


# ----------------------------------------------------------------------------- end to end
ITERS = 60  # the quickstart run the end-to-end tests share: 60 iterations at 128 pixels on 8 images
MID = 30  # and its checkpoint in the middle
SMALL = ["model.backbone.img_size=(128,128)", "model.data_preprocessor.batch_augments.0.size=(128,128)",
         "model.data_preprocessor.pad_size_divisor=128",
         "train_dataloader.dataset.pipeline.3.scale=(128,128)",
         "train_dataloader.dataset.pipeline.4.crop_size=(128,128)",
         "train_dataloader.dataset.pipeline.6.size=(128,128)", "test_dataloader.dataset.pipeline.1.scale=(128,128)",
         "val_dataloader.dataset.pipeline.1.scale=(128,128)", "train_dataloader.batch_size=2",
         "default_hooks.logger.interval=5", "randomness.seed=0"]
# InfiniteSampler: mmengine sleeps 2 s each time a DefaultSampler's epoch (4 iterations here) restarts
SCHEDULE = [f"train_cfg.max_iters={ITERS}", f"train_cfg.val_interval={ITERS}",
            f"default_hooks.checkpoint.interval={MID}",
            "param_scheduler.0.end=6", "param_scheduler.1.begin=6", f"param_scheduler.1.end={ITERS}",
            f"param_scheduler.1.T_max={ITERS - 6}", "train_dataloader.sampler.type=InfiniteSampler"]


@pytest.fixture(scope="module")
def coco_root(tmp_path_factory):
    """Synthetic COCO in mmdet's layout: ROOT/datasets/coco/{train2017,val2017,annotations}."""
    root = tmp_path_factory.mktemp("mmdet")
    load_tool("make_synthetic_coco").main(["--root", str(root / "datasets"), "--train", "8", "--val", "4",
                                           "--size", "128", "160"])
    return root


def scalars(work):
    (path,) = glob.glob(os.path.join(work, "*", "vis_data", "scalars.json"))
    return [json.loads(line) for line in open(path)]


def logged_test_metrics(work):
    """The metrics a Runner.test() run in ``work`` logged (its TIMESTAMP/TIMESTAMP.json)."""
    (path,) = glob.glob(os.path.join(work, "*", "*.json"))
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def trained(coco_root):
    """The quickstart config through tools/train_det.py: (work dir, log)."""
    work = str(coco_root / "work")
    proc, log = run(coco_root, os.path.join(ROOT, "tools", "train_det.py"), QUICKSTART, "--work-dir", work,
                    "--cfg-options", *SMALL, *SCHEDULE)
    assert proc.returncode == 0, log[-3000:]
    return work, log


def test_a_diverged_run_stops_at_once_naming_the_last_checkpoint(coco_root, tmp_path, monkeypatch):
    """A real divergence (lr 1e6) through tools/train_det.py's Runner: the DivergenceCheckHook
    stops it within a few iterations, naming the iteration, the last checkpoint (finite weights)
    and what to try."""
    monkeypatch.chdir(coco_root)
    work = tmp_path / "work"
    runner = load_tool("train_det").build_runner([QUICKSTART, "--work-dir", str(work), "--cfg-options", *SMALL,
                                                  "train_cfg.max_iters=8", "train_cfg.val_interval=8",
                                                  "default_hooks.checkpoint.interval=1",
                                                  "optim_wrapper.optimizer.lr=1e6"])
    assert_mmengine_run_stops_diverged(runner, work)


def test_mmdets_own_train_py_is_refused_mixed_precision_without_a_gpu_naming_the_fix(tmp_path):
    """A config's AmpOptimWrapper (the flagship's) as mmdet's own tools/train.py runs it
    (``SRViTRunner``, the configs' runner_type, without our tools' check): the Runner is built (a
    test run needs no optimizer), and training is refused before anything more is built, naming
    the fix, where mmengine's wrapper would fail a bare assertion of a GPU."""
    from srvit_backbones.openmmlab.runner import SRViTRunner

    cfg = Config.fromfile(QUICKSTART)
    cfg.merge_from_dict(dict(launcher="none", work_dir=str(tmp_path / "mim"), optim_wrapper=dict(
        type="AmpOptimWrapper", loss_scale="dynamic")))
    runner = SRViTRunner.from_cfg(cfg)  # as mmdet's own tools/train.py builds it
    with pytest.raises(ConfigError, match=r"^mixed precision \(mmengine's AmpOptimWrapper\) needs a GPU, and this "
                                          r"run's device is 'cpu': train in fp32, --cfg-options "
                                          r"optim_wrapper.type=OptimWrapper \(with tools/train.py's --amp, drop "
                                          r"--amp too: it sets optim_wrapper.type after --cfg-options\)$"):
        runner.train()
    assert isinstance(runner.optim_wrapper, dict)  # nothing built


def test_quickstart_learns(trained):
    """The loss falls by more than half and mmdet's CocoMetric scores the detector well above an
    untrained one (0.0): measured at this seed, box AP50 0.292 and mask AP50 0.292 after these 60
    iterations, the loss at 0.39 of its start (seeds 1 and 2: 0.269 / 0.273, 0.41; 0.309 / 0.338,
    0.40); make quickstart-mmdet's 300: box AP 47.1, mask AP 49.4 on the README's VM."""
    work, log = trained
    records = scalars(work)
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) >= ITERS // 5 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) < 0.5 * sum(losses[:3]), losses
    (metrics,) = [r for r in records if "coco/bbox_mAP" in r]
    assert metrics["coco/bbox_mAP_50"] >= 0.1 and metrics["coco/segm_mAP_50"] >= 0.1, metrics
    assert os.path.exists(os.path.join(work, f"iter_{ITERS}.pth"))


def test_resume_restores_the_checkpointed_state(coco_root, trained, monkeypatch):
    """tools/train_det.py --resume PATH (mmdet's flag) restores by value what iter_30.pth holds:
    iteration, weights, lr, AdamW moments, scheduler steps."""
    work, _ = trained
    monkeypatch.chdir(coco_root)
    ckpt_path = os.path.join(work, f"iter_{MID}.pth")
    runner = load_tool("train_det").build_runner([QUICKSTART, "--work-dir", str(coco_root / "resumed"), "--resume",
                                                  ckpt_path, "--cfg-options", *SMALL, *SCHEDULE])
    ckpt = assert_mmengine_resume_restores(runner, ckpt_path, "backbone.srvit.units.1.router.weight", max_lr=4e-4)
    assert ckpt["meta"]["iter"] == MID


def test_a_checkpoint_write_cut_short_keeps_the_last_complete_one(coco_root, trained, tmp_path, monkeypatch):
    """tools/train_det.py resumed from iter_30.pth with max_keep_ckpts=1 (mmengine would remove
    iter_30.pth before writing iter_32.pth), the disk full while iter_32.pth is written (ulimit -f):
    an error naming the file and the cause; iter_30.pth stays complete and named by
    last_checkpoint, and --resume (auto) restores it by value."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(os.path.join(trained[0], f"iter_{MID}.pth"), work)
    (work / "last_checkpoint").write_text(str(work / f"iter_{MID}.pth"))
    saved = (work / f"iter_{MID}.pth").read_bytes()
    monkeypatch.chdir(coco_root)
    options = ["--cfg-options", *SMALL, *SCHEDULE, f"train_cfg.max_iters={MID + 2}",
               "default_hooks.checkpoint.interval=2", "default_hooks.checkpoint.max_keep_ckpts=1"]
    runner = load_tool("train_det").build_runner([QUICKSTART, "--work-dir", str(work), "--resume", *options])
    with file_size_limit(len(saved) // 2), \
            pytest.raises(OSError, match=rf"'{work / f'iter_{MID + 2}.pth'}' was not written: File too large"):
        runner.train()
    assert (work / f"iter_{MID}.pth").read_bytes() == saved and not list(work.glob("*.tmp"))
    assert (work / "last_checkpoint").read_text() == str(work / f"iter_{MID}.pth")
    runner = load_tool("train_det").build_runner([QUICKSTART, "--work-dir", str(work), "--resume", *options])
    ckpt = assert_mmengine_resume_restores(runner, str(work / f"iter_{MID}.pth"),
                                           "backbone.srvit.units.1.router.weight", max_lr=4e-4)
    assert ckpt["meta"]["iter"] == MID


def test_mmdet_checkpoint_loads_into_detectron2_and_timm(trained):
    """The trained mmdet detector's backbone initialises a detectron2 detector (train.init_checkpoint's
    checkpointer) and timm.create_model(pretrained=True), by value."""
    work, _ = trained
    path = os.path.join(work, f"iter_{ITERS}.pth")
    saved = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    core = {k[len("backbone.srvit."):]: v for k, v in saved.items() if k.startswith("backbone.srvit.")}

    cfg = LazyConfig.load(os.path.join(D2_CONFIGS, "quickstart", "mask_rcnn_srvit_tiny_cpu.py"))
    cfg.model.backbone.net.img_size = 128
    model = instantiate(cfg.model)
    SRViTCheckpointer(model).load(path)
    loaded = model.backbone.net.srvit.state_dict()
    assert loaded.keys() == core.keys()
    assert [k for k, v in core.items() if not torch.equal(loaded[k], v)] == []

    net = timm.create_model("srvit_t_t2", pretrained=True, pretrained_cfg_overlay=dict(file=path), img_size=128,
                            embed_dim=64, num_heads=2, pretrained_strict=False)
    loaded = net.state_dict()
    assert [k for k, v in core.items() if not torch.equal(loaded[k], v)] == []


def test_torchrun_on_cpus_two_machines_train_as_one_and_a_killed_rank_ends_the_job(coco_root, trained, tmp_path):
    """The distributed path (--launcher pytorch, gloo), which mmengine's init_dist cannot start
    without a GPU, of both ways users train: tools/train_det.py under torchrun as 2 machines x 1
    process on 127.0.0.1, and `mim train mmdet CONFIG --gpus 2 --launcher pytorch` (mmdet's own
    tools/train.py under torch.distributed.launch; the config's ``runner_type='SRViTRunner'``) as
    1 machine x 2 processes, side by side: the same 2 steps from the same seed give the same
    weights; mim's run validates (the COCO metric) and exits 0. Then machine 1's worker is
    SIGKILLed: both torchruns exit non-zero within 120 s, no worker is left, machine 1's log names
    rank 1 and the signal, and iter_2.pth is as it was written. Beside them, `mim test mmdet CONFIG
    --checkpoint CKPT` (mmdet's own tools/test.py) tests the shared run's checkpoint."""
    options = [*SMALL, "env_cfg.dist_cfg.backend=gloo", "default_hooks.logger.interval=1",
               "default_hooks.checkpoint.interval=2", "train_dataloader.sampler.type=InfiniteSampler"]

    def launch(layout, node_rank, port):  # the warmup's lrs do not depend on max_iters
        if layout == "2x1":
            command = [*torchrun(layout, port, node_rank), os.path.join(ROOT, "tools", "train_det.py"), QUICKSTART,
                       "--launcher", "pytorch", "--cfg-options", *options, "train_cfg.max_iters=20",
                       "train_cfg.val_interval=1000"]
        else:
            command = ["-m", "mim", "train", "mmdet", QUICKSTART, "--gpus", "2", "--launcher", "pytorch", "--port",
                       str(port), "--cfg-options", *options, "train_cfg.max_iters=2", "train_cfg.val_interval=2"]
        return subprocess.Popen([sys.executable, *command, "--work-dir", str(tmp_path / layout)], cwd=str(coco_root),
                                env=dict(os.environ, OMP_NUM_THREADS="1"), stderr=subprocess.STDOUT,
                                stdout=open(tmp_path / f"{layout}_{node_rank}.log", "w"), start_new_session=True)

    port = free_port()
    machines = [launch("2x1", rank, port) for rank in (0, 1)]
    checkpoints = {layout: tmp_path / layout / "iter_2.pth" for layout in ("2x1", "1x2")}
    saved, (test_proc, test_log) = side_by_side(  # "" in a file: it exists (checkpoints are renamed in place whole)
        functools.partial(kill_machine_1_beside_one_machine, machines, launch("1x2", 0, free_port()),
                          (checkpoints["2x1"], ""), None, checkpoints["2x1"]),
        functools.partial(run, coco_root, "-m", "mim", "test", "mmdet", QUICKSTART, "--checkpoint",
                          os.path.join(trained[0], f"iter_{ITERS}.pth"), "--work-dir", str(tmp_path / "mim_test"),
                          "--cfg-options", *SMALL))
    assert test_proc.returncode == 0, test_log[-3000:]
    assert "coco/segm_mAP" in test_log
    machine_1 = (tmp_path / "2x1_1.log").read_text()
    assert re.search(r"rank\s*: 1 \(local_rank: 0\)\s+exitcode\s*: -9", machine_1), machine_1[-2000:]
    assert checkpoints["2x1"].read_bytes() == saved
    for log in ("2x1_0", "1x2_0"):  # rank 0's
        text = (tmp_path / f"{log}.log").read_text()
        assert "Distributed launcher: pytorch" in text and "GPU number: 2" in text  # mmengine's name for the world size
    assert "Iter(train) [2/2]" in text and "coco/bbox_mAP" in text  # mim's run trained and validated
    weights = [torch.load(path, map_location="cpu", weights_only=False)["state_dict"] for path in checkpoints.values()]
    assert weights[0].keys() == weights[1].keys()
    assert [k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k])] == []


def test_our_test_det_and_its_errors(coco_root, trained, tmp_path, monkeypatch):
    work, _ = trained
    out = str(tmp_path / "results.pkl")
    monkeypatch.chdir(coco_root)  # the config's data_root, datasets/coco/
    load_tool("test_det").main(["quickstart/mask_rcnn_srvit_tiny_cpu.py", os.path.join(work, f"iter_{ITERS}.pth"),
                                "--work-dir", str(tmp_path / "test"), "--out", out, "--cfg-options", *SMALL])
    assert "coco/bbox_mAP" in logged_test_metrics(tmp_path / "test") and os.path.getsize(out) > 0

    monkeypatch.chdir(tmp_path)  # no datasets/ here
    with pytest.raises(SystemExit) as missing:
        load_tool("train_det").main([QUICKSTART, "--work-dir", str(tmp_path / "w")])
    message = str(missing.value)
    assert "'datasets/coco/train2017/' does not exist" in message
    for expected in ("DATA_ROOT/train2017", "DATA_ROOT/annotations/instances_val2017.json",
                     "--cfg-options train_dataloader.dataset.data_root=", "val_evaluator.ann_file=",
                     "tools/make_synthetic_coco.py"):
        assert expected in message
    with pytest.raises(SystemExit, match="checkpoint 'missing.pth' does not exist"):
        load_tool("test_det").main([QUICKSTART, "missing.pth"])
    with pytest.raises(SystemExit, match=r"^mixed precision \(mmengine's AmpOptimWrapper\) needs a GPU, and this "
                                         r"run's device is 'cpu': train in fp32, --cfg-options "
                                         r"optim_wrapper.type=OptimWrapper$"):
        load_tool("train_det").main([FLAGSHIP, "--work-dir", str(tmp_path / "w")])  # the flagship's AmpOptimWrapper


def test_det_inferencer_and_inference_detector(coco_root, trained):
    """mmdet's own inference APIs take our config and checkpoint."""
    from mmdet.apis import DetInferencer, inference_detector, init_detector

    work, _ = trained
    ckpt = os.path.join(work, f"iter_{ITERS}.pth")
    cfg = Config.fromfile(QUICKSTART)
    cfg.merge_from_dict({o.split("=")[0]: eval(o.split("=")[1]) for o in SMALL if o.startswith("model.")})
    images = sorted(glob.glob(str(coco_root / "datasets" / "coco" / "val2017" / "*.jpg")))
    model = init_detector(cfg, ckpt, device="cpu")
    result = inference_detector(model, images[0])
    height, width = Image.open(images[0]).size[::-1]
    assert len(result.pred_instances) > 0 and result.pred_instances.masks.shape[-2:] == (height, width)
    inferencer = DetInferencer(model=cfg, weights=ckpt, device="cpu")
    out = inferencer(images[:2], return_vis=False, no_save_pred=True, pred_score_thr=0.01)
    assert len(out["predictions"]) == 2 and all(len(p["bboxes"]) > 0 for p in out["predictions"])


def test_demo_and_plot_curves_read_mmdet(coco_root, trained, tmp_path, monkeypatch, capsys):
    from srvit_backbones.analysis.demo import relative_names, run_demo
    from srvit_backbones.analysis.images import find_images
    from srvit_backbones.frameworks import adapter

    work, _ = trained
    monkeypatch.chdir(coco_root)  # the config's data_root (datasets/coco/) names the annotation file
    framework = adapter("mmdet")  # the demo as tools/demo.py builds and runs it
    images = find_images([str(coco_root / "datasets" / "coco" / "val2017")])
    opts = [o for o in SMALL if o.startswith(("model.", "test_dataloader."))]
    demo_model = framework.build_demo(framework.load_config(QUICKSTART, opts), os.path.join(work, f"iter_{ITERS}.pth"),
                                      score_threshold=0.05)
    drawn, raw, _ = run_demo(demo_model, images, relative_names(images), str(tmp_path / "demo"), save_raw=True)
    assert len(drawn) == 4 and all(os.path.getsize(p) > 0 for p in drawn)
    results = json.load(open(raw[0]))
    annotations = json.load(open(coco_root / "datasets" / "coco" / "annotations" / "instances_val2017.json"))
    dataset_ids = {c["name"]: c["id"] for c in annotations["categories"]}
    assert results and {r["category_id"] for r in results} <= set(dataset_ids.values())
    assert all(r["score"] > 0.05 and len(r["bbox"]) == 4 and "counts" in r["segmentation"] for r in results)
    classes = demo_model.inferencer.model.dataset_meta["classes"]  # labels map to the annotation file's ids by name
    assert [demo_model.category_ids[classes.index(n)] for n in ("sports ball", "tv", "kite")] == [37, 72, 38]

    framework, records = curves.read_records(curves.find_files(work))
    panels = curves.series(framework, records)
    assert framework == "mmdet" and set(panels["metric"]) == {"coco/bbox_mAP", "coco/segm_mAP"}
    assert "loss_rpn_cls" in panels["loss"] and len(panels["lr"]["lr"]) >= ITERS // 5
    # drawn as detectron2's and mmseg's: the evaluation at its iteration, AP in percent ...
    (evaluation,) = [r for r in records if "coco/bbox_mAP" in r]
    assert evaluation["step"] == ITERS  # our configs log it by iteration (log_metric_by_epoch=False)
    for metric in ("coco/bbox_mAP", "coco/segm_mAP"):
        assert panels["metric"][metric] == [(ITERS, 100 * evaluation[metric])]
    # ... and the config's lr schedule (mmengine's base_lr), not mmengine's "lr", the first
    # parameter group's: under layer decay the most-decayed one
    train = [r for r in records if "loss" in r]
    steps, lrs = zip(*panels["lr"]["lr"])
    assert list(steps) == [r["step"] for r in train] and list(lrs) == [r["base_lr"] for r in train]
    assert lrs == pytest.approx(tuple(scheduled_lrs(work, steps).values()), rel=1e-6)
    assert max(lrs) > 0.95 * 4e-4 and max(r["lr"] for r in train) < 0.1 * 4e-4
    # a run logged by epoch (mmdet's default LoggerHook): its evaluation at step 0, drawn at the
    # iteration it followed
    by_epoch = [dict(r, step=0) if r is evaluation else r for r in records]
    assert curves.series(framework, by_epoch)["metric"] == panels["metric"]
    assert f"drawn at iteration {ITERS}" in capsys.readouterr().out
    out = str(tmp_path / "curves.png")
    load_tool("plot_curves").main([work, "--output", out])
    assert os.path.getsize(out) > 0


# ----------------------------------------------------------------------------- multi-process
def _ddp_worker(rank, init_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    register_all_modules()
    for path in (FLAGSHIP, LVIS_CASCADE):
        _ddp_steps(rank, shrink(Config.fromfile(path)))
    dist.destroy_process_group()


def _ddp_steps(rank, cfg):
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    ddp = MMDistributedDataParallel(module=model, broadcast_buffers=False, find_unused_parameters=False)
    Fp16CompressionHook().before_train(type("Runner", (), {"model": ddp})())  # as the flagship's custom_hooks
    wrapper = build_optim_wrapper(ddp, cfg.optim_wrapper)
    logs = [ddp.train_step(batch(seed=10 * rank + i), wrapper) for i in range(2)]  # each rank its own data
    assert all(torch.isfinite(log["loss"]) for log in logs)
    # different data on each rank, identical weights after two steps: gradients were averaged
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    assert torch.equal(gathered[0], gathered[1])


def test_flagship_trains_under_two_process_gloo_ddp(tmp_path):
    """mmengine's DDP wrapper with its defaults (find_unused_parameters=False) and the recipe's
    fp16 gradient compression: two steps, each rank on its own data; the flagship's Mask R-CNN,
    then its LVIS Cascade Mask R-CNN (three stages, one mask head, the federated loss)."""
    mp.start_processes(_ddp_worker, args=(str(tmp_path / "dist_init"),), nprocs=2,
                       join=True, start_method="fork")  # forked: the workers need not import mmdet again


WIN_FLAGSHIP = os.path.join(CONFIG_DIR, "mask_rcnn_srvit_s_t3_win_lsj.py")


def _compiled_ddp_worker(rank):
    register_all_modules()
    cfg = shrink(Config.fromfile(WIN_FLAGSHIP))
    # a small graph to compile: one recursive block (T=2: 4 applications), 3x3 windows padded on
    # the 4x4 patch grid and the global applications
    cfg.model.backbone.update(layout=(1,), num_steps=2, window_size=3)
    assert_mmengine_compiled_training_equals_eager(
        rank, MODELS, cfg, [batch(seed=10 * rank + i) for i in range(2)],  # each rank its own data
        prepare=lambda ddp: Fp16CompressionHook().before_train(type("Runner", (), {"model": ddp})()))


def test_compiled_backbone_trains_as_the_eager_one_under_two_process_ddp(tmp_path):
    """``model.backbone.compile`` (AOT autograd's graphs, run eagerly) under mmengine's DDP
    wrapper with its defaults (find_unused_parameters=False) and the recipe's fp16 gradient
    compression: two steps of the windowed flagship Mask R-CNN give the eager run's losses and
    weights, the same on both ranks."""
    assert any(hook.type == "Fp16CompressionHook" for hook in Config.fromfile(WIN_FLAGSHIP).custom_hooks)
    two_gloo_processes(_compiled_ddp_worker, tmp_path)


# ----------------------------------------------------------------------------- the zoo: cascade/ and lvis/
LVIS_CASCADE = os.path.join(CONFIG_DIR, "lvis", "cascade_mask_rcnn_srvit_s_t3_lsj.py")


@pytest.fixture(scope="module")
def lvis_root(tmp_path_factory):
    """Synthetic LVIS v1: ROOT/coco/{train,val}2017 (mmdet's data_root, images by coco_url) and
    ROOT/lvis/lvis_v1_{train,val}.json."""
    root = tmp_path_factory.mktemp("mmdet_lvis")
    load_tool("make_synthetic_lvis").main(["--root", str(root), "--train", "4", "--val", "2", "--size", "64", "80"])
    return root


@functools.lru_cache(maxsize=None)
def _parsed(path):
    return Config.fromfile(path)


def zoo_cfg(path):
    """Config.fromfile(path), parsed once per session (a copy: the tests change theirs)."""
    return copy.deepcopy(_parsed(path))


def lvis_json(root, split):
    return str(root / "lvis" / f"lvis_v1_{split}.json")


def d2_twin(path):
    """The detectron2 config of the same detector, dataset and variant: cascade/X_lsj.py -> cascade/X.py."""
    return os.path.join(D2_CONFIGS, re.sub(r"_lsj\.py$", ".py", config_name(path)))


def detectron2_lvis_v1_image_counts():
    """detectron2's LVIS v1 metadata (detectron2/data/datasets/lvis_v1_category_image_count.py):
    each category's training image count, in id order."""
    from detectron2.data.datasets.lvis_v1_category_image_count import LVIS_CATEGORY_IMAGE_COUNT

    return torch.tensor([c["image_count"] for c in sorted(LVIS_CATEGORY_IMAGE_COUNT, key=lambda c: c["id"])])


def bbox_heads(cfg_or_module):
    heads = cfg_or_module.bbox_head
    return list(heads) if isinstance(heads, (list, torch.nn.ModuleList)) else [heads]


def test_the_zoo_is_detectron2s_zoo():
    assert len(ZOO) == 12 and all(os.path.isfile(d2_twin(p)) for p in ZOO)


@pytest.mark.parametrize("path", ZOO, ids=config_name)
def test_every_zoo_config_trains_one_step(path):
    """test_every_config_trains_one_step for cascade/ and lvis/: every parameter gets a gradient,
    the optimizer holds each; three stages with their box losses and one mask loss (detectron2's
    cascade); the LVIS heads' federated loss weighted by LVIS v1's image counts, detectron2's."""
    cfg = shrink(zoo_cfg(path))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    losses = model(**model.data_preprocessor(batch(seed=0), training=True), mode="loss")
    cascade = config_name(path).startswith(("cascade", os.path.join("lvis", "cascade")))
    expected = {f"s{i}.{k}" for i in range(3) for k in ("loss_cls", "loss_bbox")} | {"s0.loss_mask"} if cascade else \
        {"loss_cls", "loss_bbox", "loss_mask"}
    assert expected | {"loss_rpn_cls"} <= set(losses) and not {"s1.loss_mask", "s2.loss_mask"} & set(losses)
    if cascade:
        assert len(model.roi_head.mask_head) == 1
    if config_name(path).startswith("lvis"):
        expected_weights = detectron2_lvis_v1_image_counts().float() ** 0.5
        for head in bbox_heads(model.roi_head):
            assert head.num_classes == 1203 and head.fc_cls.out_features == 1204
            assert torch.equal(head.loss_cls.fed_loss_cls_weights, expected_weights)
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert [name for name, p in trainable.items() if p.grad is None] == []
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    assert sorted(id(p) for g in wrapper.optimizer.param_groups for p in g["params"]) == \
        sorted(id(p) for p in trainable.values())


@pytest.mark.parametrize("path", ZOO, ids=config_name)
def test_zoo_config_is_its_detectron2_twins_recipe(path):
    """Point by point against the detectron2 config of the same name: backbone, pyramid, data
    pipelines and padding equal the mmdet Mask R-CNN config of the variant; the cascade's stages (box weights as
    target stds, IoU, class-agnostic, LN, 4 convs + fc), the LVIS settings (classes, score
    threshold, top 300, repeat threshold, evaluator's 300 detections), schedule and layer decay."""
    cfg, d2 = zoo_cfg(path), LazyConfig.load(d2_twin(path))
    coco = zoo_cfg(os.path.join(CONFIG_DIR, os.path.basename(path).replace("cascade_", "")))
    assert cfg.model.backbone == coco.model.backbone and cfg.model.neck == coco.model.neck
    # the COCO config's data and test protocol (test_every_config_tests_at_its_padded_square's)
    assert cfg.model.data_preprocessor == coco.model.data_preprocessor
    train = cfg.train_dataloader.dataset
    assert (train.get("dataset") or train).pipeline == coco.train_pipeline == cfg.train_pipeline
    assert cfg.val_dataloader.dataset.pipeline == cfg.test_dataloader.dataset.pipeline == coco.test_pipeline
    assert cfg.custom_hooks == coco.custom_hooks
    assert cfg.optim_wrapper.optimizer.lr == d2.optimizer.lr  # LVIS: twice COCO's (test_lvis_recipe_is_vitdets)
    coco_optim = copy.deepcopy(coco.optim_wrapper)
    coco_optim.optimizer.lr = cfg.optim_wrapper.optimizer.lr
    assert cfg.optim_wrapper == coco_optim
    assert cfg.train_cfg.val_interval == d2.train.eval_period
    assert cfg.train_cfg.max_iters == d2.train.max_iter and cfg.param_scheduler[0].end == \
        round(d2.lr_multiplier.warmup_length * d2.train.max_iter) and cfg.param_scheduler[1].end == d2.train.max_iter
    assert cfg.optim_wrapper.paramwise_cfg.layer_decay_rate == d2.optimizer.params.lr_decay
    roi, d2_roi = cfg.model.roi_head, d2.model.roi_heads
    if "box_predictors" in d2_roi:
        # detectron2's CascadeROIHeads sums the stages' losses (the gradient into the features scaled by 1/3)
        assert roi.type == "SingleMaskCascadeRoIHead" and roi.stage_loss_weights == [1.0, 1.0, 1.0]
        samplers = [rcnn.sampler for rcnn in cfg.model.train_cfg.rcnn]
        assert (samplers[0].type, samplers[0].num, samplers[0].pos_fraction, samplers[0].add_gt_as_proposals) == \
            ("RandomSampler", 512, 0.25, True)  # detectron2's ROI_HEADS batch 512, positive fraction 0.25
        assert [s.type for s in samplers[1:]] == ["PseudoSampler"] * 2  # every refined box, as detectron2
        for head, rcnn, d2_head, predictor, matcher in zip(roi.bbox_head, cfg.model.train_cfg.rcnn, d2_roi.box_heads,
                                                           d2_roi.box_predictors, d2_roi.proposal_matchers):
            weights = predictor.box2box_transform.weights
            assert head.bbox_coder.target_stds == pytest.approx([1 / w for w in weights])
            assert head.reg_class_agnostic == predictor.cls_agnostic_bbox_reg is True
            assert head.type == "Shared4Conv1FCBBoxHead" and (len(d2_head.conv_dims), len(d2_head.fc_dims)) == (4, 1)
            assert head.fc_out_channels == d2_head.fc_dims[0] == 1024
            assert head.norm_cfg.type == "LayerNorm2d" and d2_head.conv_norm == "LN"
            assert rcnn.assigner.pos_iou_thr == rcnn.assigner.neg_iou_thr == matcher.thresholds[0]
            assert rcnn.assigner.match_low_quality == matcher.allow_low_quality_matches is False
    if config_name(path).startswith("lvis"):
        data = cfg.train_dataloader.dataset
        assert (data.type, data.oversample_thr, data.dataset.type) == ("ClassBalancedDataset", 0.001, "LVISV1Dataset")
        assert d2.dataloader.train.sampler.repeat_factors.repeat_thresh == data.oversample_thr
        assert cfg.val_evaluator.type == "SRViTLVISMetric" and d2.dataloader.evaluator.max_dets_per_image == 300
        assert cfg.model.test_cfg.rcnn.score_thr == 0.02 and cfg.model.test_cfg.rcnn.max_per_img == 300
        predictors = d2_roi.box_predictors if "box_predictors" in d2_roi else [d2_roi.box_predictor]
        assert {(p.test_score_thresh, p.test_topk_per_image, p.use_sigmoid_ce, p.use_fed_loss) for p in predictors} == \
            {(0.02, 300, True, True)}
        for head in bbox_heads(roi):
            assert head.num_classes == d2_roi.num_classes == 1203
            assert head.loss_cls.type == "FederatedSigmoidCELoss" and head.loss_cls.freq_weight_power == 0.5
            assert head.loss_cls.image_counts == "lvis_v1"  # the shipped counts, whatever file the dataset reads
        assert roi.mask_head.num_classes == 1203


@pytest.mark.parametrize("name", ["cascade/cascade_mask_rcnn_srvit_s_t3_lsj.py",
                                  "lvis/cascade_mask_rcnn_srvit_s_t3_lsj.py"])
def test_cascade_heads_hold_detectron2s_parameters(name):
    """The full-size RoI heads of both frameworks (three box stages, one mask head; LVIS: 1203
    classes) hold the same number of parameters, stage by stage, as the Mask R-CNN heads do."""
    path = os.path.join(CONFIG_DIR, name)
    cfg = zoo_cfg(path)
    with torch.device("meta"):  # shapes without values
        ours = MODELS.build(dict(cfg.model.roi_head, train_cfg=cfg.model.train_cfg.rcnn,
                                 test_cfg=cfg.model.test_cfg.rcnn))
        theirs = instantiate(LazyConfig.load(d2_twin(path)).model.roi_heads)  # lvis_v1_train's builtin metadata
    assert [count(h) for h in ours.bbox_head] == [count(h) + count(p) for h, p in zip(theirs.box_head,
                                                                                      theirs.box_predictor)]
    assert count(ours.mask_head) == count(theirs.mask_head) and count(ours) == count(theirs)


def test_lvis_cascade_trains_and_lvis_metric_returns_ap(lvis_root, tmp_path):
    """The LVIS Cascade Mask R-CNN through mmengine's Runner: LVISV1Dataset in ClassBalancedDataset,
    the LSJ pipeline at 64 pixels, two iterations, then SRViTLVISMetric: box and mask AP with the rare /
    common / frequent split (score threshold lowered for the untrained detector, top-k for time),
    under numpy 2, with lvis.eval left as it was."""
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    cfg = shrink(zoo_cfg(LVIS_CASCADE))
    size = (SIZE, SIZE)
    for t in cfg.train_dataloader.dataset.dataset.pipeline:
        t.update({k: size for k in ("scale", "crop_size", "size") if k in t})
    for t in cfg.val_dataloader.dataset.pipeline:
        t.update({k: size for k in ("scale",) if k in t})
    cfg.train_dataloader.dataset.dataset.update(data_root=str(lvis_root / "coco") + os.sep,
                                                ann_file=lvis_json(lvis_root, "train"))
    cfg.val_dataloader.dataset.update(data_root=str(lvis_root / "coco") + os.sep, ann_file=lvis_json(lvis_root, "val"))
    cfg.test_dataloader = cfg.val_dataloader
    cfg.val_evaluator.ann_file = cfg.test_evaluator.ann_file = lvis_json(lvis_root, "val")
    for loader in (cfg.train_dataloader, cfg.val_dataloader):
        loader.update(num_workers=0, persistent_workers=False)
    cfg.train_dataloader.batch_size = 2
    cfg.model.test_cfg.rcnn.update(score_thr=0.0, max_per_img=20)
    cfg.train_cfg.update(max_iters=2, val_interval=2)
    cfg.param_scheduler = [dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0, end=1)]
    cfg.default_hooks.checkpoint.update(interval=1000, save_last=False)
    cfg.work_dir = str(tmp_path)

    metrics = {}

    class KeepMetrics(Hook):
        def after_val_epoch(self, runner, metrics=None):
            metrics_out.update(metrics or {})

    metrics_out = metrics
    runner = Runner.from_cfg(cfg)
    runner.register_hook(KeepMetrics())
    runner.train()
    for task in ("bbox", "segm"):
        keys = [f"lvis/{task}_{k}" for k in ("AP", "AP50", "APr", "APc", "APf")]
        assert set(keys) <= set(metrics), metrics
        assert all(0 <= metrics[k] <= 1 for k in keys), metrics
    assert sys.modules["lvis.eval"].np is sys.modules["numpy"]  # the numpy 2 alias lived only inside the metric


def test_an_lvis_config_on_a_coco_file_is_explained(coco_root, lvis_root, tmp_path):
    """tools/train_det.py and test_det.py refuse an LVIS config whose annotation files are COCO's,
    naming the file, the missing field and the fix, before anything is built."""
    coco_json = str(coco_root / "datasets" / "coco" / "annotations" / "instances_val2017.json")
    data = [f"train_dataloader.dataset.dataset.data_root={lvis_root / 'coco'}/",
            f"val_dataloader.dataset.data_root={lvis_root / 'coco'}/",
            f"test_dataloader.dataset.data_root={lvis_root / 'coco'}/",
            f"train_dataloader.dataset.dataset.ann_file={lvis_json(lvis_root, 'train')}",
            f"val_dataloader.dataset.ann_file={lvis_json(lvis_root, 'val')}",
            f"test_dataloader.dataset.ann_file={lvis_json(lvis_root, 'val')}",
            f"val_evaluator.ann_file={lvis_json(lvis_root, 'val')}",
            f"test_evaluator.ann_file={lvis_json(lvis_root, 'val')}",
            "optim_wrapper.type=OptimWrapper"]
    train_det = load_tool("train_det")
    argv = [LVIS_CASCADE, "--work-dir", str(tmp_path), "--cfg-options", *data]
    for wrong, where in ((f"train_dataloader.dataset.dataset.ann_file={coco_json}", "train_dataloader.dataset.dataset"),
                         (f"val_evaluator.ann_file={coco_json}", "val_evaluator")):
        with pytest.raises(DataCheckError, match=rf"^{where}.ann_file: '.*instances_val2017.json' is not LVIS-format: "
                                                 rf"80 of its 80 categories \('person', id 1\) lack the 'frequency' "
                                                 rf"field .*tools/make_synthetic_lvis.py"):
            train_det.build_runner(argv + [wrong])
    test_det = load_tool("test_det")
    (tmp_path / "model.pth").touch()
    with pytest.raises(SystemExit, match=r"test_dataloader.dataset.ann_file: .* lack the 'frequency' field"):
        test_det.main([LVIS_CASCADE, str(tmp_path / "model.pth"), "--cfg-options", *data,
                       f"test_dataloader.dataset.ann_file={coco_json}"])


def test_an_lvis_metric_among_several_evaluators_is_checked(coco_root, lvis_root, tmp_path):
    """test_det.py --out on an LVIS config (mmdet's DumpDetResults joins the LVISMetric) checks the
    metric's file as without --out, and a config whose test_evaluator is a list of metrics has its
    LVISMetric's file checked, named by its place in the list."""
    from srvit_backbones.mmdet.tools import check_data, load_config
    from srvit_backbones.openmmlab.entry import parse_test_args

    coco_json = str(coco_root / "datasets" / "coco" / "annotations" / "instances_val2017.json")
    data = [f"test_dataloader.dataset.data_root={lvis_root / 'coco'}/",
            f"test_dataloader.dataset.ann_file={lvis_json(lvis_root, 'val')}"]
    test_det = load_tool("test_det")
    (tmp_path / "model.pth").touch()
    argv = [LVIS_CASCADE, str(tmp_path / "model.pth"), "--out", str(tmp_path / "results.pkl"), "--cfg-options", *data]
    with pytest.raises(SystemExit, match=r"^test_evaluator.ann_file: '.*instances_val2017.json' is not LVIS-format: "
                                         r".* lack the 'frequency' field"):
        test_det.main(argv + [f"test_evaluator.ann_file={coco_json}"])

    cfg = load_config(parse_test_args("mmdet", argv))
    for ann_file, error in ((lvis_json(lvis_root, "val"), None), (coco_json, r"^test_evaluator.1.ann_file: .* lack")):
        cfg.test_evaluator = [dict(type="DumpDetResults", out_file_path=str(tmp_path / "results.pkl")),
                              dict(type="LVISMetric", ann_file=ann_file)]
        if error is None:
            check_data(cfg, ("test_dataloader",))
        else:
            with pytest.raises(DataCheckError, match=error):
                check_data(cfg, ("test_dataloader",))


def test_federated_loss_is_detectron2s():
    """FederatedSigmoidCELoss gives detectron2's FastRCNNOutputLayers loss (use_sigmoid_ce,
    use_fed_loss) on the same logits, labels (background included) and class draws; its scores are
    detectron2's sigmoid ones with a background column of 0."""
    from detectron2.layers import ShapeSpec
    from detectron2.modeling.box_regression import Box2BoxTransform
    from detectron2.modeling.roi_heads import FastRCNNOutputLayers

    ours = MODELS.build(dict(type="FederatedSigmoidCELoss"))
    weights = ours.fed_loss_cls_weights
    theirs = FastRCNNOutputLayers(ShapeSpec(channels=8), box2box_transform=Box2BoxTransform((10, 10, 5, 5)),
                                  num_classes=1203, use_sigmoid_ce=True, use_fed_loss=True,
                                  get_fed_loss_cls_weights=lambda: weights)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1204, generator=g)
    labels = torch.cat([torch.randint(0, 1203, (40,), generator=g), torch.full((24,), 1203)])
    torch.manual_seed(1)
    expected = theirs.sigmoid_cross_entropy_loss(logits, labels)
    torch.manual_seed(1)
    got = ours(logits, labels, torch.ones(64), avg_factor=64)
    assert torch.allclose(got, expected, rtol=1e-6) and got > 0
    torch.manual_seed(2)
    assert not torch.allclose(ours(logits, labels), expected)  # other classes drawn: the draw counts
    scores = ours.get_activation(logits)
    assert torch.allclose(scores[:, :-1], logits[:, :-1].sigmoid(), rtol=0, atol=1e-6) and (scores[:, -1] == 0).all()


def test_lvis_recipe_is_vitdets_lr_and_eval_period():
    """The LVIS recipe's lr is twice the COCO recipe's and it evaluates every 30000 iterations:
    ViTDet's projects/ViTDet/configs/LVIS/mask_rcnn_vitdet_b_100ep.py sets optimizer.lr = 2e-4
    and train.eval_period = 30000 where COCO/mask_rcnn_vitdet_b_100ep.py keeps configs/common/
    optim.py's 1e-4 (the same batch of 64); checkpoints as often as on COCO."""
    lvis = zoo_cfg(os.path.join(CONFIG_DIR, "_base_", "mask_rcnn_srvit_sfp_lsj_lvis_v1.py"))
    coco = zoo_cfg(os.path.join(CONFIG_DIR, "_base_", "mask_rcnn_srvit_sfp_lsj_270k_coco.py"))
    assert lvis.optim_wrapper.optimizer.lr / coco.optim_wrapper.optimizer.lr == pytest.approx(2e-4 / 1e-4)
    assert lvis.train_cfg.val_interval == 30000
    assert lvis.default_hooks.checkpoint.interval == coco.default_hooks.checkpoint.interval


def test_federated_loss_weights_are_lvis_v1s_whatever_the_data_path(lvis_root, tmp_path):
    """The LVIS recipes' federated losses weigh classes by LVIS v1's image counts shipped in the
    package (detectron2's LVIS_CATEGORY_IMAGE_COUNT), with no file read: moving data_root or
    ann_file changes nothing and nothing is read at the first loss. image_counts=FILE takes that
    file's counts; the data check of tools/train_det.py checks that file before anything is built."""
    from srvit_backbones.data.lvis_v1_image_counts import LVIS_V1_TRAIN_IMAGE_COUNTS
    from srvit_backbones.mmdet.tools import check_data

    assert torch.equal(torch.tensor(LVIS_V1_TRAIN_IMAGE_COUNTS), detectron2_lvis_v1_image_counts())
    cfg = zoo_cfg(LVIS_CASCADE)
    cfg.train_dataloader.dataset.dataset.update(data_root=str(tmp_path / "elsewhere") + os.sep, ann_file="nowhere.json")
    losses = [MODELS.build(head.loss_cls) for head in bbox_heads(cfg.model.roi_head)]
    expected = detectron2_lvis_v1_image_counts().float() ** 0.5
    assert len(losses) == 3 and all(torch.equal(loss.fed_loss_cls_weights, expected) for loss in losses)

    train = lvis_json(lvis_root, "train")
    synthetic = torch.tensor([max(c["image_count"], 1) for c in sorted(json.load(open(train))["categories"],
                                                                       key=lambda c: c["id"])]).float() ** 0.5
    assert torch.equal(MODELS.build(dict(type="FederatedSigmoidCELoss", image_counts=train)).fed_loss_cls_weights,
                       synthetic)

    cfg.train_dataloader.dataset.dataset.update(data_root=str(lvis_root / "coco") + os.sep, ann_file=train)
    cfg.model.roi_head.bbox_head[2].loss_cls.image_counts = str(tmp_path / "counts.json")
    with pytest.raises(DataCheckError, match=r"^model.roi_head.bbox_head.2.loss_cls.image_counts: the federated "
                                             r"loss's image_counts file '.*counts.json' does not exist"):
        check_data(cfg, ("train_dataloader",))
    cfg.model.roi_head.bbox_head[2].loss_cls.update(image_counts=train, num_classes=80)
    with pytest.raises(DataCheckError, match=r"^model.roi_head.bbox_head.2.loss_cls.image_counts: the federated "
                                             r"loss has num_classes=80 but image_counts file '.*' lists 1203 "
                                             r"categories"):
        check_data(cfg, ("train_dataloader",))


def test_an_lvis_file_is_parsed_once_per_process(lvis_root, tmp_path, monkeypatch):
    """The data check of every LVIS file of a cascade config (train, val, evaluator: two files) and
    three federated losses given the training file parse each file once per process (LVIS v1's
    training file is about 1 GB), and again once it changes."""
    import srvit_backbones.data.lvis as lvis
    from srvit_backbones.mmdet.tools import check_data

    train = shutil.copy(lvis_json(lvis_root, "train"), str(tmp_path / "train.json"))
    val = shutil.copy(lvis_json(lvis_root, "val"), str(tmp_path / "val.json"))
    parsed = []
    real_load = json.load
    monkeypatch.setattr(lvis.json, "load", lambda f, **kwargs: parsed.append(f.name) or real_load(f, **kwargs))
    cfg = zoo_cfg(LVIS_CASCADE)
    cfg.train_dataloader.dataset.dataset.update(data_root=str(lvis_root / "coco") + os.sep, ann_file=train)
    for name in ("val_dataloader", "test_dataloader"):
        cfg[name].dataset.update(data_root=str(lvis_root / "coco") + os.sep, ann_file=val)
    cfg.val_evaluator.ann_file = cfg.test_evaluator.ann_file = val
    for head in bbox_heads(cfg.model.roi_head):
        head.loss_cls.image_counts = train
    check_data(cfg, ("train_dataloader", "val_dataloader"))
    check_data(cfg, ("test_dataloader",))
    for head in bbox_heads(cfg.model.roi_head):
        assert MODELS.build(head.loss_cls).fed_loss_cls_weights is not None  # the property reads the image counts
    assert sorted(parsed) == sorted([train, val])
    data = real_load(open(train))
    data["categories"][0]["image_count"] += 1
    json.dump(data, open(train, "w"))
    os.utime(train, ns=(0, os.stat(val).st_mtime_ns + 10**9))  # a new version, even where mtime is coarse
    assert lvis.lvis_summary(train).categories[0]["image_count"] == data["categories"][0]["image_count"]
    assert sorted(parsed) == sorted([train, val, train])


def test_an_lvis_file_without_image_count_is_refused(lvis_root, tmp_path):
    """check_lvis_annotations refuses an LVIS file whose categories lack 'image_count' (every LVIS v1
    file carries it; the federated loss weighs its classes by it when given the file), naming the
    field, the first such category and the fix."""
    from srvit_backbones.data.lvis import LVISFormatError, check_lvis_annotations

    data = json.load(open(lvis_json(lvis_root, "train")))
    del data["categories"][5]["image_count"]
    path = tmp_path / "no_image_count.json"
    path.write_text(json.dumps(data))
    name = data["categories"][5]["name"]
    with pytest.raises(LVISFormatError, match=rf"1 of its 1203 categories \('{name}', id 6\) lack the 'image_count' "
                                              rf"field .*tools/make_synthetic_lvis.py"):
        check_lvis_annotations(str(path))
    check_lvis_annotations(lvis_json(lvis_root, "train"))


def test_cascade_scales_the_box_stages_gradient_into_the_features_as_detectron2():
    """detectron2's CascadeROIHeads sums the stages' box losses and scales the gradient each stage
    sends into the pooled features by 1 / stages (_ScaleGradient in
    detectron2/modeling/roi_heads/cascade_rcnn.py), the box heads' own gradients whole; at test
    time nothing is scaled."""
    cfg = shrink(zoo_cfg(os.path.join(CONFIG_DIR, "cascade", "cascade_mask_rcnn_srvit_s_t3_lsj.py")))
    torch.manual_seed(0)
    head = MODELS.build(dict(cfg.model.roi_head, train_cfg=cfg.model.train_cfg.rcnn, test_cfg=cfg.model.test_cfg.rcnn))
    features = tuple(torch.randn(2, CHANNELS, SIZE // s, SIZE // s, requires_grad=True) for s in (4, 8, 16, 32))
    rois = torch.tensor([[0, 4.0, 4, 40, 30], [1, 10, 2, 60, 50], [1, 0, 0, 20, 20]])
    grads = {}
    for training in (True, False):
        head.train(training)
        for f in (*features, *head.parameters()):
            f.grad = None
        for stage in range(3):
            out = head._bbox_forward(stage, features, rois)
            (out["cls_score"].square().sum() + out["bbox_pred"].square().sum()).backward()
        grads[training] = ([f.grad.clone() for f in features], [p.grad.clone() for p in head.bbox_head.parameters()])
    assert any(g.abs().sum() > 0 for g in grads[False][0])
    for trained, plain in zip(grads[True][0], grads[False][0]):
        assert torch.allclose(trained, plain / 3, rtol=1e-5, atol=1e-8)
    for trained, plain in zip(grads[True][1], grads[False][1]):
        assert torch.allclose(trained, plain, rtol=1e-5, atol=1e-8)


def sorted_rows(rois):
    """RoIs (image index, x0, y0, x1, y1) in one order: by image, then by the box."""
    for column in reversed(range(rois.shape[1])):
        rois = rois[torch.argsort(rois[:, column], stable=True)]
    return rois


def test_cascade_later_stages_train_on_every_refined_box_as_detectron2():
    """detectron2's CascadeROIHeads trains stages 2 and 3 on every box the previous stage refined
    (those refined from the ground truth added as proposals included; no ground truth added
    again): each later stage's RoIs are the previous stage's RoIs moved by its box deltas (in
    mmdet's order: the positives first)."""
    cfg = shrink(zoo_cfg(os.path.join(CONFIG_DIR, "cascade", "cascade_mask_rcnn_srvit_s_t3_lsj.py")))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    roi, seen = model.roi_head, []
    bbox_loss = roi.bbox_loss

    def recording_bbox_loss(stage, x, sampling_results):
        gt_added = [bool(r.pos_is_gt.any()) for r in sampling_results]
        results = bbox_loss(stage, x, sampling_results)
        seen.append((gt_added, results["rois"].detach(), results["bbox_pred"].detach(), results["cls_score"].detach()))
        return results

    roi.bbox_loss = recording_bbox_loss
    data = model.data_preprocessor(batch(seed=0), training=True)
    model(**data, mode="loss")
    assert len(seen) == 3 and all(seen[0][0])  # stage 1 samples with the ground truth added, as detectron2
    for stage in (1, 2):
        previous_rois, deltas = seen[stage - 1][1], seen[stage - 1][2]
        refined = torch.cat([previous_rois[:, :1], roi.bbox_head[stage - 1].bbox_coder.decode(
            previous_rois[:, 1:], deltas, max_shape=(SIZE, SIZE))], dim=1)
        assert not any(seen[stage][0])  # no ground truth added again
        assert torch.allclose(sorted_rows(seen[stage][1]), sorted_rows(refined), atol=1e-4)


@pytest.mark.parametrize("name", ["cascade/cascade_mask_rcnn_srvit_s_t3_lsj.py",
                                  "lvis/cascade_mask_rcnn_srvit_s_t3_lsj.py"])
def test_cascade_scores_are_the_mean_of_the_stages_probabilities_as_detectron2(name):
    """detectron2's CascadeROIHeads scores the final boxes by the mean of the three stages'
    probabilities (softmax; sigmoid with the federated loss: predict_probs, averaged in
    detectron2/modeling/roi_heads/cascade_rcnn.py), where mmdet's CascadeRoIHead averages logits:
    the scores the last head's activation gives are that mean."""
    cfg = shrink(zoo_cfg(os.path.join(CONFIG_DIR, name)))
    torch.manual_seed(0)
    head = MODELS.build(dict(cfg.model.roi_head, train_cfg=cfg.model.train_cfg.rcnn, test_cfg=cfg.model.test_cfg.rcnn))
    head.eval()
    logits = []
    for stage in head.bbox_head:
        stage.register_forward_hook(lambda module, args, out: logits.append(out[0]))
    features = tuple(torch.randn(2, CHANNELS, SIZE // s, SIZE // s) for s in (4, 8, 16, 32))
    rois = torch.tensor([[0, 4.0, 4, 40, 30], [1, 10, 2, 60, 50], [1, 0, 0, 20, 20]])
    metas = [dict(img_shape=(SIZE, SIZE))] * 2
    with torch.no_grad():
        _, cls_scores, _ = head._refine_roi(features, rois, metas, (1, 2))
    last = head.bbox_head[-1]
    if name.startswith("lvis"):
        expected = torch.stack(logits).sigmoid().mean(0)[:, :-1]
        got = last.loss_cls.get_activation(torch.cat(cls_scores))[:, :-1]
    else:
        expected, got = torch.stack(logits).softmax(-1).mean(0), torch.cat(cls_scores).softmax(-1)
    assert len(logits) == 3 and not torch.allclose(logits[0], logits[1])
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- your own data
CUSTOM_CLASSES = ["disc", "box", "wedge"]


def test_fine_tune_a_coco_detector_on_three_classes_of_your_own(coco_root, trained, tmp_path, monkeypatch, capsys):
    """tools/train_det.py --coco-train/--coco-val (mmdet's metainfo + ann_file + data_prefix, set
    from the file) from the 80-class quickstart run: the heads are sized from the file's 3
    categories, their class-dependent layers start anew (listed in the log), CocoMetric scores the
    file's classes, and 30 iterations at lr 1e-3 learn: box AP50 above 0.1 (measured at this seed:
    box AP50 0.437; seeds 1 and 2, from a 20-iteration base on other images: 0.133 and 0.350).
    The tool runs in this process."""
    work, _ = trained
    data = tmp_path / "mydata"
    load_tool("make_synthetic_coco").main(["--root", str(data), "--train", "8", "--val", "4", "--size", "128", "160",
                                           "--categories", *CUSTOM_CLASSES])
    out = tmp_path / "work"
    iters = 30
    monkeypatch.chdir(tmp_path)
    load_tool("train_det").main([
        QUICKSTART, "--work-dir", str(out),
        "--coco-train", str(data / "annotations" / "train.json"), str(data / "train"),
        "--coco-val", str(data / "annotations" / "val.json"), str(data / "val"),
        "--cfg-options", f"load_from={os.path.join(work, f'iter_{ITERS}.pth')}", *SMALL,
        f"train_cfg.max_iters={iters}", f"train_cfg.val_interval={iters}", f"default_hooks.checkpoint.interval={iters}",
        "param_scheduler.0.end=4", "param_scheduler.1.begin=4", f"param_scheduler.1.end={iters}",
        f"param_scheduler.1.T_max={iters - 4}", "train_dataloader.sampler.type=InfiniteSampler",
        "optim_wrapper.optimizer.lr=1e-3"])
    assert "data check: 14 files" in capsys.readouterr().out
    (log_file,) = glob.glob(str(out / "*" / "*.log"))
    log = open(log_file).read()
    assert re.search(r"6 class-dependent tensors start from their initialisation.*"
                     r"roi_head.bbox_head.fc_cls.weight \(81, 256\) -> \(4, 256\)", log), log[-3000:]
    saved = torch.load(out / f"iter_{iters}.pth", map_location="cpu", weights_only=False)
    assert saved["meta"]["dataset_meta"]["classes"] == tuple(CUSTOM_CLASSES)
    # from the run's log, as the user reads it
    (ap50,) = re.findall(r"Iter\(val\).*coco/bbox_mAP_50: ([0-9.]+)", log)
    assert float(ap50) > 0.1, log[-3000:]
