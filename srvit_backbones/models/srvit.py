"""SR-ViT: a DeiT-style ViT whose middle blocks are grouped into SoftMoR units (Algorithm 1); every block sits in a
unit, so feature indices count units. Also bViT (``ordinary_blocks=False``, ``aggregation='last'``, ``step_features``).
Traceable as timm's ViT is (FX, TorchScript, ``torch.export``): size-dependent Python runs in FX leaves."""
import math
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from timm.layers import (
    Attention,
    PatchEmbed,
    is_exporting,
    register_notrace_function,
    resample_abs_pos_embed,
    trunc_normal_,
)
from timm.models._features import feature_take_indices
from timm.models._manipulate import named_apply
from timm.models.vision_transformer import Block, get_init_weights_vit

from .attention import RelPosAttention
from .layer_ids import layer_depth, layer_id
from .rel_pos import check_kernel, is_rel_pos
from .rules import NO_CLASS_TOKEN, carries_class_token, check_merge_ratio, check_merging_allowed, is_int_in
from .schedule import Schedule, build_schedule
from .softmor import AGGREGATIONS, SoftMoRUnit

ORGANISATIONS = ("coarse_to_fine", "fine_to_coarse", "coarse_grained", "fine_grained")
WEIGHT_INITS = ("", "jax", "jax_nlhb", "moco")
GLOBAL_POOLS = ("token", "avg", "")


def make_layout(organisation: str, num_middle_blocks: int) -> Tuple[int, ...]:
    """Unit sizes for the blocks between the first and last ordinary blocks.

    Args:
        organisation: ``coarse_to_fine`` (n, n-1, ..., 1), ``fine_to_coarse`` (the reverse), ``coarse_grained`` (one
            unit of all) or ``fine_grained`` (units of one).
        num_middle_blocks: the blocks to lay out (triangular for the first two).

    Raises:
        ValueError: an unknown organisation, or a block count it cannot lay out.
    """
    if organisation not in ORGANISATIONS:
        raise ValueError(f"layout organisation must be one of {ORGANISATIONS}, got {organisation!r}")
    if num_middle_blocks < 1:
        raise ValueError(f"num_middle_blocks must be >= 1, got {num_middle_blocks}")
    if organisation == "coarse_grained":
        return (num_middle_blocks,)
    if organisation == "fine_grained":
        return (1,) * num_middle_blocks
    n = int(round((math.sqrt(8 * num_middle_blocks + 1) - 1) / 2))
    if n * (n + 1) // 2 != num_middle_blocks:
        raise ValueError(
            f"layout {organisation!r} needs a triangular number of middle blocks (1, 3, 6, 10, ...), "
            f"got {num_middle_blocks}; pass an explicit layout tuple instead")
    sizes = tuple(range(n, 0, -1))
    return sizes if organisation == "coarse_to_fine" else sizes[::-1]


def resolve_layout(layout: Union[str, Sequence[int]], num_middle_blocks: int) -> Tuple[int, ...]:
    """Unit sizes of a ``layout`` argument: an organisation name (``make_layout``) or the sizes
    themselves; a ValueError for anything else."""
    if isinstance(layout, str):
        return make_layout(layout, num_middle_blocks)
    layout = tuple(layout)
    if len(layout) == 0 or not all(is_int_in(k, 1) for k in layout):
        raise ValueError(f"layout must be an organisation name {ORGANISATIONS} or a non-empty sequence of "
                         f"unit sizes >= 1, got {layout!r}")
    return layout


def serves_as_is(old_grid: List[int], new_grid: List[int]) -> bool:
    """Whether a position table made for ``old_grid`` serves ``new_grid`` as it is: the same grid,
    and not under ``torch.export`` (which must not keep the example input's size)."""
    return not is_exporting() and old_grid[0] == new_grid[0] and old_grid[1] == new_grid[1]


def resize_pos_embed(grid_tokens: torch.Tensor, old_grid: List[int], new_grid: List[int],
                     mode: str = "bicubic") -> torch.Tensor:
    """Resize a (1, h*w, D) position table without prefix tokens from ``old_grid`` to ``new_grid`` (timm's
    ``resample_abs_pos_embed`` with ``mode``), at run time (dense inputs) and at load time alike."""
    if serves_as_is(old_grid, new_grid):
        return grid_tokens
    return resample_abs_pos_embed(grid_tokens, new_size=[new_grid[0], new_grid[1]],
                                  old_size=[old_grid[0], old_grid[1]], num_prefix_tokens=0,
                                  interpolation=mode, antialias=False)


@torch.fx.wrap
@register_notrace_function
def check_image_batch(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """``x`` unchanged if it is a (B, C, H, W) batch with H and W multiples of the patch size,
    else a ValueError that says how to pad. A leaf for FX that stays in the traced graph."""
    if x.dim() != 4:
        raise ValueError(f"expected an image batch (B, C, H, W), got shape {list(x.shape)}")
    h, w = x.shape[-2], x.shape[-1]
    if h % patch_size != 0 or w % patch_size != 0:
        raise ValueError(
            f"input size {h}x{w} is not a multiple of the patch size {patch_size}: pad the image to a "
            f"multiple of {patch_size} (detectron2: square_pad or size_divisibility; mmseg: the data "
            f"preprocessor's size / size_divisor)")
    return x


@torch.fx.wrap
@register_notrace_function
def pos_embed_for_grid(pos_embed: torch.Tensor, num_prefix_tokens: int, old_grid: Tuple[int, int],
                       new_grid: Tuple[int, int], mode: str) -> torch.Tensor:
    """The (1, prefix + h*w, D) position table for a (h, w) patch grid: the table itself at its
    own grid, else its grid part resized (``resize_pos_embed``). A leaf for FX."""
    if serves_as_is([old_grid[0], old_grid[1]], [new_grid[0], new_grid[1]]):
        return pos_embed
    n = num_prefix_tokens
    grid_tokens = resize_pos_embed(pos_embed[:, n:], [old_grid[0], old_grid[1]], [new_grid[0], new_grid[1]], mode)
    return torch.cat([pos_embed[:, :n], grid_tokens], dim=1)


def _check_arguments(embed_dim: int, num_heads: int, weight_init: str, aggregation: str, num_steps: int,
                     step_features: bool, use_rel_pos: bool, rel_pos_kernel: Optional[str]):
    """The model's own arguments (the schedule, the unit, the pooling and the attention check theirs)."""
    if check_kernel(rel_pos_kernel) is not None and not use_rel_pos:
        raise ValueError(f"rel_pos_kernel={rel_pos_kernel!r} chooses the relative-position attention's kernel, and "
                         f"this model has none: use use_rel_pos=True, or rel_pos_kernel=None")
    if embed_dim % num_heads != 0:
        raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
    if weight_init not in WEIGHT_INITS:
        raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {weight_init!r}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if step_features and aggregation != "last" and is_int_in(num_steps, 2):
        raise ValueError(f"step_features=True takes features at recursion steps, but a unit with "
                         f"aggregation={aggregation!r} mixes its steps: use aggregation='last' (bViT), or "
                         f"step_features=False to take the units' mixed outputs")


class SRViT(nn.Module):
    """Soft Mixture-of-Recursions Vision Transformer (timm-style model).

    With windows or relative positions (ViTDet's dense-prediction options) the model carries no class token (a
    checkpoint's class-token position is dropped on load) and the classifier averages the patch tokens.

    Args:
        img_size, patch_size, in_chans, num_classes, embed_dim, num_heads, mlp_ratio, qkv_bias, drop_rate,
            proj_drop_rate, attn_drop_rate, weight_init: as timm's ``VisionTransformer``.
        global_pool: 'token', 'avg' or ''; None: 'token' if the model carries a class token, else 'avg'.
        layout: sizes K of the recursive units, or an organisation name (``make_layout``).
        num_middle_blocks: the blocks an organisation name lays out.
        num_steps: recursion depth T of every recursive unit (T=1: a plain ViT, e.g. DeiT).
        aggregation, step_transforms, zero_init_recursion: see ``SoftMoRUnit``.
        distilled: add a DeiT distillation token and head.
        drop_path_rate: stochastic depth, linear over the effective depth.
        pos_embed_interp: the position table's resize interpolation, at run and at load time.
        window_size: ViTDet's windows of this many patches but in ``global_attn_indexes``; 0: global attention.
        global_attn_indexes: the global block applications (step-major); None: ``default_global_attn_indexes``.
        use_rel_pos: ViTDet's decomposed relative positions (``attention.RelPosAttention``).
        rel_pos_kernel: the ``rel_pos.KERNELS`` kernel of every call; None: ``rel_pos.choose_kernel``'s.
        ordinary_blocks: the ordinary first and last blocks; False for bViT.
        step_features: feature indices count recursion steps, not units (bViT); needs ``aggregation='last'``.
        token_merge_ratio: ToMe merging of this fraction of the patch tokens in each recursive unit (0: off; <= 0.5;
            global attention without relative positions).

    Raises:
        ValueError: an argument out of its range or options that exclude each other.
    """

    #: Python-side helpers, not for TorchScript
    __jit_unused_properties__ = ["pretrain_grid", "unit_sizes", "default_feature_indices", "num_steps", "layout",
                                 "ordinary_blocks", "step_features", "drop_path_rate", "window_size", "effective_depth",
                                 "global_attn_indexes", "feature_points", "recursive_unit_indices", "feature_info"]

    def __init__(
        self,
        img_size: Union[int, Tuple[int, int]] = 224, patch_size: int = 16, in_chans: int = 3,
        num_classes: int = 1000, global_pool: Optional[str] = None,
        embed_dim: int = 384, num_heads: int = 6, mlp_ratio: float = 4.0, qkv_bias: bool = True,
        layout: Union[str, Sequence[int]] = (4, 3, 2, 1), num_middle_blocks: int = 10, num_steps: int = 3,
        aggregation: str = "soft", step_transforms: bool = True, zero_init_recursion: bool = True,
        distilled: bool = False,
        drop_rate: float = 0.0, proj_drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.0,
        pos_embed_interp: str = "bicubic", weight_init: str = "",
        window_size: int = 0, global_attn_indexes: Optional[Sequence[int]] = None, use_rel_pos: bool = False,
        ordinary_blocks: bool = True, step_features: bool = False, token_merge_ratio: float = 0.0,
        rel_pos_kernel: Optional[str] = None,
    ):
        super().__init__()
        _check_arguments(embed_dim, num_heads, weight_init, aggregation, num_steps, step_features, use_rel_pos,
                         rel_pos_kernel)
        self.schedule = build_schedule(resolve_layout(layout, num_middle_blocks), num_steps, ordinary_blocks,
                                       step_features, drop_path_rate, window_size, global_attn_indexes)
        class_token = carries_class_token(window_size, use_rel_pos)
        global_pool = ("token" if class_token else "avg") if global_pool is None else global_pool
        self._check_pool(global_pool, class_token, distilled)
        self.global_pool, self.distilled = global_pool, distilled
        self.num_features = self.embed_dim = self.head_hidden_size = embed_dim
        self.num_prefix_tokens = (2 if distilled else 1) if class_token else 0
        self.use_rel_pos, self.rel_pos_kernel, self.pos_embed_interp = use_rel_pos, rel_pos_kernel, pos_embed_interp
        self.weight_init, self.zero_init_recursion = weight_init, zero_init_recursion
        self.distilled_training = False  # DeiT: return (cls, dist) logits in training when set
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                      embed_dim=embed_dim, strict_img_size=False)
        self.patch_size = self.patch_embed.patch_size[0]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if distilled else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + self.num_prefix_tokens, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        block = partial(Block, dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                        proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=0.0, norm_layer=norm_layer,
                        attn_layer=RelPosAttention if use_rel_pos else Attention)
        self.units = nn.ModuleList(SoftMoRUnit(self._blocks(u, block), self.schedule.of_unit(u), aggregation,
                                               step_transforms, zero_init_recursion)
                                   for u in range(len(self.schedule.plan)))
        self.norm = norm_layer(embed_dim)
        self.head_drop = nn.Dropout(drop_rate)
        self.reset_classifier(num_classes)
        self.set_token_merge_ratio(token_merge_ratio)
        self.init_weights()

    def _blocks(self, unit: int, block: Callable[[], nn.Module]) -> List[nn.Module]:
        """The unique blocks of ``unit``, with the relative-position tables of the extents it is applied at."""
        blocks = [block() for _ in range(self.schedule.plan[unit][0])]
        for j, b in enumerate(blocks):
            if isinstance(b.attn, RelPosAttention):
                window, has_global = self.schedule.extents(unit, j)
                b.attn.add_rel_pos_tables(window, self.patch_embed.grid_size if has_global else None)
                b.attn.rel_pos_kernel = self.rel_pos_kernel
        return blocks

    num_steps = property(lambda self: self.schedule.num_steps, doc="T of every recursive unit")
    layout = property(lambda self: self.schedule.layout, doc="sizes K of the recursive units")
    ordinary_blocks = property(lambda self: self.schedule.ordinary_blocks)
    step_features = property(lambda self: self.schedule.step_features)
    drop_path_rate = property(lambda self: self.schedule.drop_path_rate)
    window_size = property(lambda self: self.schedule.window_size)
    effective_depth = property(lambda self: self.schedule.depth, doc="D_eff: block applications per forward pass")
    global_attn_indexes = property(lambda self: self.schedule.global_indexes,
                                   doc="the block applications that attend over the whole grid")
    feature_points = property(lambda self: list(self.schedule.features),
                              doc="(unit, step) of every feature index (step -1: the unit's output)")
    recursive_unit_indices = property(lambda self: self.schedule.recursive_units)
    default_feature_indices = property(lambda self: self.schedule.default_feature_indices,
                                       doc="the features dense heads take by default (``default_out_indices``)")

    @property
    def feature_info(self) -> List[Dict]:
        """timm's feature metadata: channels, stride and module of every feature index."""
        return [dict(num_chs=self.embed_dim, reduction=self.patch_size,
                     module=f"units.{u}" if t < 0 else f"units.{u}.step{t}") for u, t in self.schedule.features]

    def feature_name(self, index: int) -> str:
        """Key of feature ``index`` in ``forward_feature_maps``: ``unit{i}``, or ``step{i}`` with ``step_features``."""
        return f"step{index}" if self.step_features else f"unit{index}"

    def set_num_steps(self, num_steps: int):
        """Run every recursive unit ``num_steps`` times on the same weights (bViT: any depth).

        Raises:
            ValueError: a unit's parameters depend on T (a router, step transforms), or a block would lack the
                relative-position tables of its new applications; nothing changes.
        """
        schedule = self.schedule.with_num_steps(num_steps)
        for u, unit in enumerate(self.units):
            unit.check_applications(schedule.of_unit(u))
        if self.use_rel_pos:
            self._check_rel_pos_tables(schedule)
        for u, unit in enumerate(self.units):
            unit.set_applications(schedule.of_unit(u))
        self.schedule = schedule

    def _check_rel_pos_tables(self, schedule: Schedule):
        """Refuse a depth whose applications do not match the extents of each block's relative-position tables."""
        def extents(flags):
            return " and ".join(name for name, on in flags.items() if on) or "no"

        for u, unit in enumerate(self.units):
            for j, block in enumerate(unit.blocks):
                window, has_global = schedule.extents(u, j)
                needed = {"windowed": bool(window), "global": has_global}
                held = {"windowed": hasattr(block.attn, "window_rel_pos_h"),
                        "global": hasattr(block.attn, "global_rel_pos_h")}
                if needed != held:
                    raise ValueError(
                        f"at num_steps={schedule.num_steps}, block {j} of unit {u} would have {extents(needed)} "
                        f"applications, but its relative-position tables are for {extents(held)} applications (those "
                        f"of num_steps={self.num_steps}): build the model with num_steps={schedule.num_steps}, which "
                        f"gives every block the tables its applications use")

    def set_token_merge_ratio(self, ratio: float):
        """Token merging in every recursive unit (the class's ``token_merge_ratio``); 0 = off.

        Raises:
            ValueError: a ratio out of [0, 0.5], no recursive unit, or windows / relative positions.
        """
        ratio = check_merge_ratio(ratio)
        recursive = [self.units[u] for u in self.recursive_unit_indices if self.units[u].num_steps > 1]
        if ratio and not recursive:
            raise ValueError("token merging works inside recursive units (T > 1) and this model has none: "
                             "use token_merge_ratio=0")
        if ratio:
            check_merging_allowed(bool(self.window_size), self.use_rel_pos)
        for unit in recursive:
            unit.set_token_merge_ratio(ratio)
        self.token_merge_ratio = ratio

    def init_weights(self, mode: Optional[str] = None, zero_init_recursion: Optional[bool] = None):
        """(Re-)initialise all weights as timm's ViT does; ``mode`` (one of WEIGHT_INITS) and ``zero_init_recursion``
        default to the model's (a framework calling ``init_weights()`` keeps both)."""
        mode = self.weight_init if mode is None else mode
        if mode not in WEIGHT_INITS:
            raise ValueError(f"weight_init must be one of {WEIGHT_INITS}, got {mode!r}")
        zero_init_recursion = self.zero_init_recursion if zero_init_recursion is None else zero_init_recursion
        head_bias = -math.log(self.num_classes) if "nlhb" in mode and self.num_classes > 0 else 0.0
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.dist_token is not None:
            trunc_normal_(self.dist_token, std=0.02)
        named_apply(get_init_weights_vit(mode, head_bias), self)
        for unit in self.units:
            unit.reset_recursion_parameters(zero_init_recursion)
        for module in self.modules():
            if isinstance(module, RelPosAttention):
                module.reset_rel_pos()

    @torch.jit.ignore
    def no_weight_decay(self):
        """Position embeddings, tokens and relative-position tables (as detectron2's MViTv2 configs)."""
        return {"pos_embed", "cls_token", "dist_token"} | {n for n, _ in self.named_parameters() if is_rel_pos(n)}

    unit_sizes = property(lambda self: [len(unit.blocks) for unit in self.units], doc="unique blocks per unit")

    def get_layer_depth(self, param_name: str, prefix: str = "") -> Tuple[int, int]:
        """mmpretrain's layer-decay protocol: (layer id, number of ids) of ``layer_ids.layer_id``'s rule."""
        return layer_depth(param_name, self.unit_sizes, prefix)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False):
        """timm's parameter grouping: one group per layer id of ``layer_ids.layer_id`` (so that
        ``create_optimizer_v2(layer_decay=...)`` follows the one rule); ``coarse``: one per unit."""
        if coarse:
            return dict(stem=r"^cls_token|^dist_token|^pos_embed|^patch_embed",
                        blocks=[(r"^units\.(\d+)", None), (r"^norm", (99999,))])
        unit_sizes = self.unit_sizes
        return lambda name: layer_id(name, unit_sizes)

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True):
        self.grad_checkpointing = enable
        for unit in self.units:
            unit.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None):
        self.num_classes = num_classes
        if global_pool is not None:
            self._check_pool(global_pool, self.cls_token is not None, self.distilled)
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.head_dist = (nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()) \
            if self.distilled else None

    @staticmethod
    def _check_pool(global_pool: str, class_token: bool, distilled: bool):
        if distilled and not class_token:
            raise ValueError(f"distilled=True needs the class and distillation tokens, but {NO_CLASS_TOKEN}: use "
                             f"window_size=0 and use_rel_pos=False to distil")
        if global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}, got {global_pool!r}")
        if global_pool == "token" and not class_token:
            raise ValueError(f"global_pool='token' needs the class token, but {NO_CLASS_TOKEN}: use "
                             f"global_pool='avg' (mean of the patch tokens) or ''")
        if global_pool == "avg" and distilled:
            raise ValueError("a distilled model pools its class and distillation tokens: use global_pool='token'")

    @torch.jit.ignore
    def set_distilled_training(self, enable: bool = True):
        self.distilled_training = enable

    pretrain_grid = property(lambda self: tuple(self.patch_embed.grid_size), doc="the patch grid of ``img_size``")

    def _pos_embed(self, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        pos_embed = pos_embed_for_grid(self.pos_embed, self.num_prefix_tokens, self.patch_embed.grid_size, grid,
                                       self.pos_embed_interp)
        prefix: List[torch.Tensor] = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.dist_token is not None:
            prefix.append(self.dist_token.expand(x.shape[0], -1, -1))
        x = torch.cat(prefix + [x], dim=1) + pos_embed
        return self.pos_drop(x)

    def embed(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Images (B, C, H, W) -> tokens (B, prefix + H/16 * W/16, D) and the patch grid
        (no prefix tokens with windowed attention or relative positions)."""
        x = check_image_batch(x, self.patch_size)
        grid = (x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size)
        x = self.patch_embed(x)
        return self._pos_embed(x, grid), grid

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x, grid = self.embed(x)
        for unit in self.units:
            x = unit(x, grid=grid)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False):
        if self.global_pool == "":
            return x if pre_logits else self.head(self.head_drop(x))
        if self.global_pool == "avg":
            x = self.head_drop(x[:, self.num_prefix_tokens:].mean(dim=1))
            return x if pre_logits else self.head(x)
        x_cls = self.head_drop(x[:, 0])
        if pre_logits:
            return x_cls
        if self.head_dist is None:  # not distilled (a None test: TorchScript drops the branch)
            return self.head(x_cls)
        x_dist = self.head_drop(x[:, 1])
        logits, logits_dist = self.head(x_cls), self.head_dist(x_dist)
        if self.distilled_training and self.training and not torch.jit.is_scripting():
            return logits, logits_dist
        return (logits + logits_dist) / 2

    def forward(self, x: torch.Tensor):
        return self.forward_head(self.forward_features(x))

    def tokens_to_map(self, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """(B, prefix + h*w, C) -> (B, C, h, w), class/distillation tokens removed."""
        x = x[:, self.num_prefix_tokens:]
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[-1], grid[0], grid[1])

    def _forward_units(self, x: torch.Tensor, indices: Sequence[int], return_mixture: bool = False,
                       stop_early: bool = False):
        """Run the model, keeping the tokens of the features in ``indices``: (final tokens before
        the norm, {index: tokens}, {unit: mixture (B, N, T)} of units with a router, grid)."""
        wanted = {i: self.feature_points[i] for i in indices}
        last = max(u for u, _ in wanted.values()) if (stop_early and wanted) else len(self.units) - 1
        x, grid = self.embed(x)
        outputs, mixtures = {}, {}
        for u, unit in enumerate(self.units[:last + 1]):
            here = {i: t for i, (v, t) in wanted.items() if v == u}
            steps = sorted(t for t in here.values() if t >= 0)
            if steps:
                x, tapped = unit.forward_steps(x, steps, grid=grid)
                outputs.update({i: tapped[steps.index(t)] for i, t in here.items()})
                continue
            if return_mixture and here:
                x, weights = unit(x, return_weights=True, grid=grid)
                if weights is not None:
                    mixtures[u] = weights
            else:
                x = unit(x, grid=grid)
            outputs.update({i: x for i in here})
        return x, outputs, mixtures, grid

    def forward_feature_maps(self, x: torch.Tensor, indices: Optional[Sequence[int]] = None,
                             return_mixture: bool = False) -> Dict[str, torch.Tensor]:
        """Dense-prediction features, the entry point of the framework adapters.

        Args:
            x: (B, C, H, W) images.
            indices: feature indices; None: ``default_feature_indices``.
            return_mixture: add each recursive unit's router weights.

        Returns:
            NCHW stride-16 maps keyed by ``feature_name``, plus ``last_feat`` (the last block's
            output without the final norm, the Simple Feature Pyramid's input) and with
            ``return_mixture`` ``mixture{i}``, unit i's (B, T, h, w) weights.

        Raises:
            ValueError: an index the model does not have.
        """
        indices = self.default_feature_indices if indices is None else self._check_indices(indices)
        x, outputs, mixtures, grid = self._forward_units(x, indices, return_mixture)
        feats = {self.feature_name(i): self.tokens_to_map(outputs[i], grid) for i in indices}
        feats["last_feat"] = self.tokens_to_map(x, grid)
        for i, w in mixtures.items():
            feats[f"mixture{i}"] = self.tokens_to_map(w, grid)
        return feats

    def _check_indices(self, indices: Sequence[int]) -> List[int]:
        n = len(self.feature_points)
        out = []
        for i in indices:
            if not is_int_in(i, -n, n):
                what = (f"{n} recursion steps as features (0..{n - 1})" if self.step_features else
                        f"{n} units (0..{n - 1}; recursive units {list(self.recursive_unit_indices)})")
                raise ValueError(f"feature index {i!r} does not exist: this model has {what}")
            out.append(i % n)
        return out

    def forward_intermediates(self, x: torch.Tensor, indices: Optional[Union[int, List[int]]] = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
                              intermediates_only: bool = False, return_prefix_tokens: bool = False):
        """timm's intermediate-feature API (``features_only`` uses it); indices as ``feature_info``'s."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, _ = feature_take_indices(len(self.feature_points), indices)
        x, outputs, _, grid = self._forward_units(x, take_indices, stop_early=stop_early or intermediates_only)
        intermediates = []
        for i in take_indices:
            tokens = self.norm(outputs[i]) if norm else outputs[i]
            prefix = tokens[:, :self.num_prefix_tokens]
            feat = self.tokens_to_map(tokens, grid) if output_fmt == "NCHW" else tokens[:, self.num_prefix_tokens:]
            intermediates.append((feat, prefix) if return_prefix_tokens else feat)
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True):
        """timm's API: drop the units (with ``step_features``, the steps) after the last of
        ``indices``, so that no parameter of a backbone is left without a gradient."""
        take_indices, max_index = feature_take_indices(len(self.feature_points), indices)
        unit, step = self.feature_points[max_index]
        plan = list(self.schedule.plan[:unit + 1])
        if step >= 0:
            plan[unit] = (plan[unit][0], step + 1)
        schedule = self.schedule.restricted(plan)
        self.units = self.units[:unit + 1]
        if schedule.plan[unit] != self.schedule.plan[unit]:
            self.units[unit].truncate(schedule.of_unit(unit))
        self.schedule = schedule
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices
