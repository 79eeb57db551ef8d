"""Every shipped mmseg config trains (one step, every parameter gets a gradient), and the
flagship trains under 2-process DDP with mmengine's default find_unused_parameters=False.

The configs run at a tiny width and crop with BN instead of SyncBN (CPU); everything else
(variant, layout, T, out_indices, neck, heads, optimizer constructor) is as shipped."""
import glob
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from mmengine.config import Config
from mmengine.model import MMDistributedDataParallel
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample
from mmseg.utils import register_all_modules

import srvit_backbones.mmseg  # noqa: F401  (registers SRViT)
from helpers import assert_mmengine_compiled_training_equals_eager, two_gloo_processes
from srvit_backbones import create_srvit
from srvit_backbones.openmmlab.tools import sync_bn_to_bn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(ROOT, "mmseg_configs")
CONFIGS = sorted(p for p in glob.glob(os.path.join(CONFIG_DIR, "**", "*.py"), recursive=True)
                 if "_base_" not in os.path.relpath(p, CONFIG_DIR).split(os.sep))
FLAGSHIP = os.path.join(CONFIG_DIR, "upernet_srvit_s.py")
WIDTH, HEADS, SIZE = 32, 2, 64

register_all_modules()


@pytest.fixture(autouse=True)
def mmseg_scope():
    """Each test builds in mmseg's registries, whatever scope an earlier test's Runner or
    demo left current (mmengine's default scope is process-wide)."""
    with DefaultScope.overwrite_default_scope("mmseg"):
        yield


def shrink(cfg: Config) -> Config:
    """The config's segmentor at width 32 and 64x64 crops, with BN, without a pretrained file."""
    model = cfg.model
    model.data_preprocessor.size = (SIZE, SIZE)
    model.backbone.update(img_size=(SIZE, SIZE), embed_dim=WIDTH, num_heads=HEADS)
    model.backbone.pop("init_cfg", None)
    model.neck.update(in_channels=[WIDTH] * len(model.neck.in_channels), out_channels=WIDTH)
    model.decode_head.update(in_channels=[WIDTH] * len(model.decode_head.in_channels), channels=16)
    aux = model.get("auxiliary_head")
    for head in (aux if isinstance(aux, list) else [aux] if aux else []):
        head.update(in_channels=WIDTH, channels=16)
    sync_bn_to_bn(model)
    return cfg


def batch(seed: int, n: int = 2) -> dict:
    """A data batch as mmseg's PackSegInputs makes it: uint8 images and label maps."""
    g = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for _ in range(n):
        inputs.append(torch.randint(0, 256, (3, SIZE, SIZE), dtype=torch.uint8, generator=g))
        sample = SegDataSample(metainfo=dict(img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 150, (1, SIZE, SIZE), generator=g))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.relpath(p, CONFIG_DIR))
def test_every_config_trains_one_step(path):
    cfg = shrink(Config.fromfile(path))
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.train()
    backbone = model.backbone
    # holds only what it returns (the units up to the last, or bViT's steps up to the last)
    assert len(backbone.srvit.feature_points) == max(backbone.out_indices) + 1

    data = model.data_preprocessor(batch(seed=0), training=True)
    loss, _ = model.parse_losses(model(**data, mode="loss"))
    assert torch.isfinite(loss)
    loss.backward()
    trainable = {name: p for name, p in model.named_parameters() if p.requires_grad}
    assert [name for name, p in trainable.items() if p.grad is None] == []
    assert all(torch.isfinite(p.grad).all() for p in trainable.values())

    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    grouped = [id(p) for group in wrapper.optimizer.param_groups for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in trainable.values())  # each parameter exactly once
    before = {name: p.detach().clone() for name, p in trainable.items()}
    wrapper.step()
    recursive = f"backbone.srvit.units.{backbone.srvit.recursive_unit_indices[0]}.blocks.0.attn.qkv.weight"
    assert not torch.equal(before[recursive], trainable[recursive])


def _train_steps(ddp, cfg, batches):
    wrapper = build_optim_wrapper(ddp, cfg.optim_wrapper)
    return [ddp.train_step(data, wrapper) for data in batches]


def _ddp_worker(rank, init_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    register_all_modules()
    cfg = shrink(Config.fromfile(FLAGSHIP))
    batches = [batch(seed=10 * rank + i) for i in range(2)]  # each rank its own data

    # Control: the adapter before the fix held and ran the whole core, whose last block
    # (units.5) feeds no output. Wrapped as mmengine wraps (find_unused_parameters=False),
    # the second iteration fails. Own process group, so that its unfinished reduction stays there.
    torch.manual_seed(0)
    unfixed = MODELS.build(cfg.model)
    core = create_srvit(cfg.model.backbone.variant, img_size=SIZE, embed_dim=WIDTH, num_heads=HEADS,
                        num_classes=0, global_pool="")
    core.norm = nn.Identity()
    unfixed.backbone.srvit = core
    control = MMDistributedDataParallel(module=unfixed, broadcast_buffers=False, find_unused_parameters=False,
                                        process_group=dist.new_group(backend="gloo"))
    with pytest.raises(RuntimeError, match="Expected to have finished reduction in the prior iteration"):
        _train_steps(control, cfg, batches)

    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    ddp = MMDistributedDataParallel(module=model, broadcast_buffers=False, find_unused_parameters=False)
    logs = _train_steps(ddp, cfg, batches)
    assert all(torch.isfinite(log["loss"]) for log in logs)
    # different data on each rank, identical weights after two steps: gradients were averaged
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    assert torch.equal(gathered[0], gathered[1])
    dist.destroy_process_group()


def test_flagship_trains_under_two_process_gloo_ddp(tmp_path):
    mp.start_processes(_ddp_worker, args=(str(tmp_path / "dist_init"),), nprocs=2, join=True,
                       start_method="fork")  # forked: the workers need not import mmseg again


# ----------------------------------------------------------------------------- compiled training
WIN = os.path.join(CONFIG_DIR, "upernet_srvit_s_win.py")


def _compiled_ddp_worker(rank):
    register_all_modules()
    cfg = shrink(Config.fromfile(WIN))
    # a small graph to compile: two recursive units of one block (T=2: 6 applications), 3x3
    # windows padded on the 4x4 patch grid and the global applications; UPerNet's four maps
    cfg.model.backbone.update(layout=(1, 1), num_steps=2, window_size=3, out_indices=(0, 1, 2, 3))
    assert_mmengine_compiled_training_equals_eager(rank, MODELS, cfg,
                                                   [batch(seed=10 * rank + i) for i in range(2)])  # each rank its own


def test_compiled_backbone_trains_as_the_eager_one_under_two_process_ddp(tmp_path):
    """``model.backbone.compile`` (AOT autograd's graphs, run eagerly) under mmengine's DDP
    wrapper with its defaults (find_unused_parameters=False): two steps of the windowed UPerNet
    give the eager run's losses and weights, the same on both ranks."""
    two_gloo_processes(_compiled_ddp_worker, tmp_path)
