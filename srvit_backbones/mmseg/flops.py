"""An mmseg segmentor's Table 4 row (tools/count_flops.py, ``MMSegAdapter.count_flops``)."""

import torch
import torch.nn as nn
from mmengine.config import Config
from mmseg.registry import MODELS
from mmseg.utils import register_all_modules

from ..analysis.flops import Counted, attention_split, count_flops, count_params, count_parts
from ..analysis.flops_table import table_row


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
    """The Table 4 row of the mmseg config ``path``: the segmentor's tensor forward on a crop-sized
    image, plus the backbone units it prunes (built on the meta device unless ``plain``)."""
    register_all_modules()
    cfg = Config.fromfile(path)
    h, w = cfg.crop_size
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    x = torch.zeros(1, 3, h, w)
    if plain:
        run = count_flops(model, (x,), plain=True)
    else:
        heads = repr({k: v for k, v in cfg.model.to_dict().items() if k != "backbone"})
        run = attention_split(count_parts(model, (x,), "backbone", x, heads, counted))[0]
    held, device = model.backbone.srvit, "cpu" if plain else "meta"
    with torch.device(device):
        whole = MODELS.build(dict(cfg.model.backbone, out_indices=[*model.backbone.out_indices, -1])).srvit
    pruned = _Units(whole.units[len(held.units):], (h // held.patch_size, w // held.patch_size))
    tokens = torch.zeros(1, held.num_prefix_tokens + pruned.grid[0] * pruned.grid[1], held.embed_dim, device=device)
    unused = count_flops(pruned, (tokens,), plain, counted.blocks) if len(pruned.units) else 0
    params = count_params(model)
    return table_row(path, "segmentation", (h, w), params + count_params(pruned), params, 2 * (run + unused),
                     2 * run, run)
