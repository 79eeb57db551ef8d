"""mmseg's part of the measuring harness: a segmentor's training steps timed (the GPU check's (b))."""
import torch
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

from ..analysis.benchmark.timing import Timer
from ..config_files import resolve_config
from ..openmmlab.tools import sync_bn_to_bn
from . import SRViTBackbone  # noqa: F401  (registers the backbone)


def synthetic_segmentation_batch(images, size, classes=150):
    """(inputs, data samples) as mmseg's ADE20K pipeline yields them, with random label maps."""
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(images):
        inputs.append(torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g))
        sample = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, classes, (1, size, size), generator=g))
        samples.append(sample)
    return inputs, samples


def segmentor_steps(config, size, images, device, warmup=1, steps=1):
    """``MMSegAdapter.time_training``: ``warmup + steps`` training steps of the config's segmentor on
    synthetic images, without its pretrained file, through mmengine's ``AmpOptimWrapper`` (dynamic
    loss scale) on CUDA, elsewhere in fp32 with plain BN; the check's row."""
    cfg = Config.fromfile(resolve_config("mmseg", config))
    cfg.model.data_preprocessor.size = (size, size)
    cfg.model.backbone.img_size = (size, size)
    cfg.model.backbone.pop("init_cfg", None)
    device_type = torch.device(device).type
    if device_type == "cuda":
        cfg.optim_wrapper.update(type="AmpOptimWrapper", loss_scale="dynamic")
    else:
        sync_bn_to_bn(cfg.model)
    with DefaultScope.overwrite_default_scope("mmseg"):
        model = MODELS.build(cfg.model).to(device)
        model.init_weights()
        model.train()
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    inputs, samples = synthetic_segmentation_batch(images, size)
    timer = Timer(device)
    for _ in range(warmup + steps):
        with timer.step(), DefaultScope.overwrite_default_scope("mmseg"):
            log = model.train_step(dict(inputs=inputs, data_samples=samples), wrapper)
    amp = isinstance(wrapper, AmpOptimWrapper)  # its cast_dtype None is autocast's own: fp16 on CUDA
    scale = wrapper.loss_scaler.get_scale() if amp else None
    dtype = (wrapper.cast_dtype or torch.get_autocast_dtype("cuda")) if amp else None
    return dict(config=config, size=size, images=images, optim_wrapper=type(wrapper).__name__,
                autocast_dtype=str(dtype).replace("torch.", "") if dtype else None, loss_scale=scale,
                loss=float(log["loss"].detach()), **timer.summary(warmup))
