"""detectron2's part of the measuring harness: a config's detector stepped on synthetic COCO-like
images (the benchmark's --detector, the GPU check's trainer) and ViTDet's ``ViT`` as an anchor."""
import functools
import itertools

import torch
from detectron2.engine import HookBase
from detectron2.modeling import ViT
from detectron2.structures import Instances, PolygonMasks
from detectron2.utils.events import EventStorage
from detectron2.utils.registry import locate

from ..analysis.benchmark.timing import Timer, train_step
from ..training.amp import autocast
from .backbone import SRViTBackbone
from .training import build_model, build_optimizer, build_trainer, load_config


def builds_srvit(net_cfg):
    """Whether a LazyConfig node builds an ``SRViTBackbone`` (the configs' ``model.backbone.net``)."""
    target = net_cfg.get("_target_")
    if isinstance(target, str):
        target = locate(target)
    return isinstance(target, type) and issubclass(target, SRViTBackbone)


def detector_config(config, opts=(), grad_checkpointing=False, compile=None):
    """The config as tools/train_net.py loads it, with ``opts``, activation checkpointing and an SR-ViT
    backbone's ``compile`` switch (torch.compile's arguments).

    Returns:
        (cfg, input size), the size being ``model.backbone.square_pad``.

    Raises:
        ValueError: the config has no ``square_pad``, naming the fix.
    """
    opts = list(opts) + (["model.backbone.net.use_act_checkpoint=True"] if grad_checkpointing else [])
    cfg = load_config(config, opts)
    if compile is not None and "backbone" in cfg.model and builds_srvit(cfg.model.backbone.net):
        cfg.model.backbone.net.compile = dict(compile)
    size = cfg.model.backbone.get("square_pad") if "backbone" in cfg.model else None
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"--detector {config}: the detector mode needs model.backbone.square_pad (the ViTDet "
                         f"input size; the images are made that size), got {size!r}: use a config with a "
                         f"SimpleFeaturePyramid backbone such as detectron2_configs/mask_rcnn_srvit_s_t3.py")
    return cfg, size


def synthetic_detection_batch(batch_size, size, seed=0):
    """Images with four instances each (boxes, classes, polygon masks), as detectron2's COCO mapper yields them."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(0.10, 0.10, 0.40, 0.50), (0.50, 0.20, 0.90, 0.60), (0.20, 0.60, 0.50, 0.90), (0.60, 0.65, 0.85, 0.95)]
    batch = []
    for _ in range(batch_size):
        polygons = [[[x0 * size, y0 * size, x1 * size, y0 * size, (x0 + x1) / 2 * size, y1 * size]]
                    for x0, y0, x1, y1 in shapes]  # triangles
        masks = PolygonMasks(polygons)
        instances = Instances((size, size), gt_boxes=masks.get_bounding_boxes(),
                              gt_classes=torch.tensor([1, 2, 3, 4]), gt_masks=masks)
        batch.append({"image": torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g),
                      "instances": instances, "height": size, "width": size})
    return batch


def detector_step(config, opts=(), *, mode="train", batch_size=1, device="cpu", grad_checkpointing=False,
                  amp_dtype=None, compile=None):
    """(step, model, input size): a function running one ``infer`` or ``train`` step (the config's
    optimizer, no loss scaling) of the config's model on a synthetic batch, autocast to ``amp_dtype``
    if given. With ``compile`` the backbone alone is compiled (SR-ViT by its switch, ViTDet's ``ViT``
    by ``Module.compile``)."""
    cfg, size = detector_config(config, opts, grad_checkpointing, compile)
    model = build_model(cfg, device)
    if compile is not None and not isinstance(model.backbone.net, SRViTBackbone):
        model.backbone.net.compile(**compile)
    batch = synthetic_detection_batch(batch_size, size)
    amp = functools.partial(autocast, str(device), amp_dtype is not None, amp_dtype)
    if mode == "infer":
        model.eval()
        images = [{k: v for k, v in x.items() if k != "instances"} for x in batch]

        def step():
            with torch.inference_mode(), amp():
                model(images)
        return step, model, size
    model.train()
    optimizer = build_optimizer(cfg, model)

    def step():
        with EventStorage(), amp():  # the detector logs training statistics
            losses = model(batch)
        train_step(sum(loss.float() for loss in losses.values()), optimizer)
    return step, model, size


def trainer_steps(config, opts=(), *, images=1, warmup=1, steps=1):
    """``Detectron2Adapter.time_training``: ``warmup + steps`` iterations of the trainer tools/train_net.py
    builds (AMPTrainer where ``train.amp.enabled``) on a synthetic batch; the check's row."""
    cfg, size = detector_config(config, opts)
    model = build_model(cfg)
    trainer = build_trainer(cfg, model, itertools.repeat(synthetic_detection_batch(images, size)),
                            build_optimizer(cfg, model))
    timer = Timer(cfg.train.device)

    class TimeSteps(HookBase):
        def before_step(self):
            timer.start()

        def after_step(self):
            timer.stop()

    trainer.register_hooks([TimeSteps()])
    trainer.train(0, warmup + steps)
    precision = getattr(trainer, "precision", None)
    return dict(config=config, size=size, images_per_gpu=images, trainer=type(trainer).__name__,
                autocast_dtype=str(precision).replace("torch.", "") if precision else None,
                grad_scale=trainer.grad_scaler.get_scale() if hasattr(trainer, "grad_scaler") else None,
                total_loss=trainer.storage.latest()["total_loss"][0], **timer.summary(warmup))


class LastFeature(torch.nn.Module):
    """detectron2's ``ViT`` returns {"last_feat": map}; the steps take the map."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x)["last_feat"]


def vitdet_same_depth(model, size, grad_ckpt):
    """ViTDet's ``ViT`` with ``model``'s (an SR-ViT's) width, heads, applications and windows, rel-pos on."""
    depth = model.effective_depth
    return LastFeature(ViT(
        img_size=size, patch_size=16, embed_dim=model.embed_dim, depth=depth,
        num_heads=model.units[0].blocks[0].attn.num_heads, mlp_ratio=4, qkv_bias=True,
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6), window_size=model.window_size,
        window_block_indexes=[i for i in range(depth) if i not in model.global_attn_indexes],
        use_rel_pos=True, use_act_checkpoint=grad_ckpt, out_feature="last_feat"))
