"""mmseg's part of the measuring harness (``srvit_backbones.benchmark``): a config's segmentor
with the optim wrapper a GPU user trains it with, stepped and timed (the GPU check's (b),
``MMSegAdapter.time_training``), and synthetic ADE20K-like batches."""
import torch
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

from ..benchmark.timing import Timer
from ..config_files import resolve_config
from ..openmmlab.tools import sync_bn_to_bn
from . import SRViTBackbone  # noqa: F401  (registers the backbone)


def synthetic_segmentation_batch(images, size, classes=150):
    """(inputs, data samples) as mmseg's ADE20K pipeline yields them: uint8 CHW images and
    ``SegDataSample``s with a random label map of ``classes`` classes."""
    g = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(images):
        inputs.append(torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g))
        sample = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, classes, (1, size, size), generator=g))
        samples.append(sample)
    return inputs, samples


def segmentor_step(config, size, images, device):
    """(step, optim wrapper): one training step of an mmseg config's segmentor (``train_step``
    through its optim wrapper) on ``images`` synthetic images at ``size``, without the config's
    pretrained file (the step, not the accuracy), through mmengine's ``AmpOptimWrapper`` with a
    dynamic loss scale on CUDA (what a GPU user switches on, ``--amp``: fp16), in fp32 elsewhere,
    on the CPU with plain BN (SyncBN needs CUDA). The step returns the step's log (``loss`` and
    its parts)."""
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

    def step():
        with DefaultScope.overwrite_default_scope("mmseg"):
            return model.train_step(dict(inputs=inputs, data_samples=samples), wrapper)
    return step, wrapper


def segmentor_steps(config, size, images, device, warmup=1, steps=1):
    """``warmup + steps`` steps of ``segmentor_step`` (AmpOptimWrapper on CUDA): the GPU check's
    row of s/iter, peak memory, loss, autocast dtype and loss scale."""
    step, wrapper = segmentor_step(config, size, images, device)
    timer = Timer(device)
    for _ in range(warmup + steps):
        with timer.step():
            log = step()
    amp = isinstance(wrapper, AmpOptimWrapper)  # its cast_dtype None is autocast's own: fp16 on CUDA
    scale = wrapper.loss_scaler.get_scale() if amp else None
    dtype = (wrapper.cast_dtype or torch.get_autocast_dtype("cuda")) if amp else None
    return dict(config=config, size=size, images=images, optim_wrapper=type(wrapper).__name__,
                autocast_dtype=str(dtype).replace("torch.", "") if dtype else None, loss_scale=scale,
                loss=float(log["loss"].detach()), **timer.summary(warmup))
