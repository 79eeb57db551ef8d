"""Each framework the set-up installs does real work here, not only imports."""
import subprocess
import sys

import torch


def test_torch_pinned():
    import torchvision

    assert torch.__version__.split("+")[0] == "2.14.1"
    assert torchvision.__version__.split("+")[0] == "0.29.1"


def test_detectron2_vitdet_config_builds():
    from detectron2.config import instantiate
    from detectron2.model_zoo import get_config
    from detectron2.modeling.backbone.vit import SimpleFeaturePyramid

    cfg = get_config("common/models/mask_rcnn_vitdet.py")
    assert cfg.model.backbone._target_ is SimpleFeaturePyramid
    # shrink the ViT so that the real instantiate() runs quickly
    cfg.model.backbone.net.update(embed_dim=64, depth=2, num_heads=2, img_size=256, window_size=0,
                                  window_block_indexes=[], residual_block_indexes=[])
    cfg.model.backbone.square_pad = 256
    model = instantiate(cfg.model).eval()
    feats = model.backbone(torch.randn(1, 3, 256, 256))
    assert set(feats) == {"p2", "p3", "p4", "p5", "p6"} and feats["p2"].shape[-1] == 64


def test_mmcv_ops_roi_align_runs_on_cpu():
    from mmcv.ops import roi_align

    feats = torch.arange(2 * 1 * 8 * 8, dtype=torch.float32).reshape(2, 1, 8, 8)
    rois = torch.tensor([[0, 0, 0, 4, 4], [1, 2, 2, 6, 6]], dtype=torch.float32)
    out = roi_align(feats, rois, (2, 2), 1.0, 2, "avg", True)
    assert out.shape == (2, 1, 2, 2) and torch.isfinite(out).all()
    assert out[1].mean() > out[0].mean()  # second roi lies in the later image / larger values


def test_mmseg_uperhead_and_multilevel_neck_run():
    from mmseg.registry import MODELS
    from mmseg.utils import register_all_modules

    register_all_modules()
    neck = MODELS.build(dict(type="MultiLevelNeck", in_channels=[32] * 4, out_channels=32, scales=[4, 2, 1, 0.5]))
    head = MODELS.build(dict(type="UPerHead", in_channels=[32] * 4, in_index=[0, 1, 2, 3], pool_scales=(1, 2),
                             channels=16, num_classes=5, norm_cfg=dict(type="BN", requires_grad=True),
                             align_corners=False))
    feats = neck([torch.randn(2, 32, 8, 8) for _ in range(4)])
    assert [f.shape[-1] for f in feats] == [32, 16, 8, 4]
    assert head(list(feats)).shape == (2, 5, 32, 32)


def test_mmdet_fpn_roi_extractor_and_iou_run():
    """mmdet's registry builds its FPN and its RoI extractor (mmcv's compiled RoIAlign inside),
    and they compute: on a map whose value is the x coordinate, RoIAlign averages samples of a
    linear function, so each bin gives its centre's x on the feature map (aligned: image
    coordinate / stride - 0.5); the IoU of two boxes is the one by hand."""
    import mmdet
    from mmdet.registry import MODELS
    from mmdet.structures.bbox import bbox_overlaps
    from mmdet.utils import register_all_modules

    assert mmdet.__version__ == "3.3.0"
    register_all_modules(init_default_scope=False)  # and build in mmdet's scope, whichever is the default now
    neck = MODELS.build(dict(type="FPN", in_channels=[8, 16], out_channels=8, num_outs=3, _scope_="mmdet"))
    pyramid = neck([torch.randn(1, 8, 16, 16), torch.randn(1, 16, 8, 8)])
    assert [tuple(f.shape) for f in pyramid] == [(1, 8, 16, 16), (1, 8, 8, 8), (1, 8, 4, 4)]

    extractor = MODELS.build(dict(type="SingleRoIExtractor", out_channels=8, featmap_strides=[4, 8], _scope_="mmdet",
                                  roi_layer=dict(type="RoIAlign", output_size=2, sampling_ratio=2)))
    x_coordinate = [torch.arange(n, dtype=torch.float32).expand(1, 8, n, n).contiguous() for n in (16, 8)]
    rois = torch.tensor([[0, 8, 8, 40, 40], [0, 4, 12, 28, 44]], dtype=torch.float32)  # small: level 0, stride 4
    pooled = extractor(x_coordinate, rois)
    assert pooled.shape == (2, 8, 2, 2)
    for roi, out in zip(rois, pooled):
        x1, x2 = roi[1] / 4, roi[3] / 4
        centres = x1 - 0.5 + (torch.arange(2) + 0.5) * (x2 - x1) / 2
        torch.testing.assert_close(out, centres.expand(8, 2, 2))
    iou = bbox_overlaps(torch.tensor([[0.0, 0, 10, 10]]), torch.tensor([[5.0, 5, 15, 15]]))
    torch.testing.assert_close(iou, torch.tensor([[25 / 175]]))  # 5x5 overlap of 100 + 100 - 25


def test_timm_creates_a_vit():
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=3)
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 3)


def test_fvcore_counts_flops():
    from fvcore.nn import FlopCountAnalysis

    flops = FlopCountAnalysis(torch.nn.Linear(10, 20), torch.randn(4, 10))
    assert flops.total() == 4 * 10 * 20


def test_collect_env_reports_every_framework():
    out = subprocess.run([sys.executable, "-m", "srvit_backbones.collect_env"], capture_output=True, text=True,
                         check=True).stdout
    for name in ["Python", "torch", "CUDA available", "torchvision", "detectron2", "mmcv", "mmengine",
                 "mmsegmentation", "mmdet", "timm", "fvcore", "numpy"]:
        assert name in out
    assert "with compiled ops" in out and "from:" in out
    assert "not importable" not in out
