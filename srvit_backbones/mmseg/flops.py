"""An mmseg segmentor's parameters and FLOPs, whole, in the paper's convention (tools/count_flops.py
--task segmentation, Table 4; ``MMSegAdapter.count_flops``): see ``srvit_backbones.flops_table``."""
import copy

import torch
import torch.nn as nn
from mmengine.config import Config
from mmseg.registry import MODELS
from mmseg.utils import register_all_modules

from ..flops import Counted, attention_split, count_flops, count_flops_by_operator, count_params, count_parts
from ..flops_table import table_row


class _Units(nn.Module):
    """Backbone units run on the tokens of a patch grid (units a shipped segmentor prunes)."""

    def __init__(self, units, grid):
        super().__init__()
        self.units, self.grid = units, grid

    def forward(self, x):
        for unit in self.units:
            x = unit(x, grid=self.grid)
        return x


def count_segmentor(path: str, counted: Counted, plain: bool = False) -> dict:
    """The Table 4 row of the mmseg config ``path``: the whole UPerNet (mmseg's ``mode='tensor'``
    forward: backbone, neck, decode head) on a crop-sized image, and the backbone units it prunes,
    taken from a build of the same backbone that returns the last unit too (on the meta device
    unless ``plain``: its blocks are counted as the held ones are, by ``BlockApplications``)."""
    register_all_modules()
    cfg = Config.fromfile(path)
    h, w = cfg.crop_size
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    x = torch.zeros(1, 3, h, w)
    if plain:
        run = count_flops(model, (x,), plain=True)
    else:
        heads = copy.deepcopy(cfg.model)
        heads.pop("backbone")
        run = attention_split(count_parts(model, (x,), "backbone", x, repr(heads.to_dict()), counted))[0]
    held = model.backbone.srvit
    with torch.device("cpu" if plain else "meta"):
        whole = MODELS.build(dict(cfg.model.backbone, out_indices=[*model.backbone.out_indices, -1])).srvit
    pruned = _Units(whole.units[len(held.units):], (h // held.patch_size, w // held.patch_size))
    tokens = torch.zeros(1, held.num_prefix_tokens + pruned.grid[0] * pruned.grid[1], held.embed_dim)
    if not len(pruned.units):
        unused = 0
    elif plain:
        unused = count_flops(pruned, (tokens,), plain=True)
    else:
        unused = attention_split(count_flops_by_operator(pruned, (tokens.to("meta"),), traced=counted.blocks))[0]
    params = count_params(model)
    return table_row(path, "segmentation", (h, w), params + count_params(pruned), params, 2 * (run + unused),
                     2 * run, run)
