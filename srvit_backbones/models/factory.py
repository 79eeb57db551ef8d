"""Named SR-ViT variants (paper Table 2), bViT, and their timm registration: after ``import srvit_backbones``,
``timm.create_model('srvit_s_t3', ...)`` works. No weights are hosted: ``timm.create_model(name, pretrained=True,
pretrained_cfg_overlay=dict(file=PATH))`` loads a file."""
from functools import partial
from typing import Any, Callable, Dict, Optional

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model

from .schedule import default_out_indices
from .srvit import SRViT, resolve_layout

# width / heads per size; blocks = first + middle + last ordinary blocks
SIZES: Dict[str, Dict[str, Any]] = {
    "t": dict(embed_dim=384, num_heads=6, layout=(3, 2, 1), num_middle_blocks=6),  # 8 unique blocks
    "s": dict(embed_dim=384, num_heads=6, layout=(4, 3, 2, 1), num_middle_blocks=10),  # 12 unique blocks
    "b": dict(embed_dim=512, num_heads=8, layout=(4, 3, 2, 1), num_middle_blocks=10),  # 12 unique blocks
    # DeiT baselines: T=1, twelve ordinary blocks (one unit each, so unit i = layer i)
    "deit_s": dict(embed_dim=384, num_heads=6, layout=(1,) * 10, num_middle_blocks=10, num_steps=1),
    "deit_b": dict(embed_dim=768, num_heads=12, layout=(1,) * 10, num_middle_blocks=10, num_steps=1),
}
# bViT: one shared block applied 12 times, the last step's output (naive recursion: no router,
# no step transforms), no ordinary first/last blocks; features at steps 3/6/9/12 like DeiT's layers
BVIT = dict(layout=(1,), num_middle_blocks=1, num_steps=12, aggregation="last", step_transforms=False,
            ordinary_blocks=False, step_features=True)
VARIANTS: Dict[str, Dict[str, Any]] = {
    "srvit_t_t2": dict(SIZES["t"], num_steps=2),
    "srvit_t_t3": dict(SIZES["t"], num_steps=3),
    "srvit_s_t2": dict(SIZES["s"], num_steps=2),
    "srvit_s_t3": dict(SIZES["s"], num_steps=3),
    "srvit_s_t4": dict(SIZES["s"], num_steps=4),
    "srvit_b_t2": dict(SIZES["b"], num_steps=2),
    "srvit_b_t3": dict(SIZES["b"], num_steps=3),
    "srvit_deit_s": dict(SIZES["deit_s"]),
    "srvit_deit_b": dict(SIZES["deit_b"]),
    "bvit_s": dict(BVIT, embed_dim=384, num_heads=6),
    "bvit_b": dict(BVIT, embed_dim=768, num_heads=12),
}


def variant_args(name: str) -> Dict[str, Any]:
    """Constructor arguments of a named variant (a copy); a ValueError listing the variants for another name."""
    if name not in VARIANTS:
        raise ValueError(f"unknown SR-ViT variant {name!r}; known variants: {', '.join(VARIANTS)}")
    return dict(VARIANTS[name])


def _cfg(**kwargs) -> Dict[str, Any]:
    return {
        "url": "", "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": None,
        "crop_pct": 0.875, "interpolation": "bicubic", "fixed_input_size": False,
        "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
        "first_conv": "patch_embed.proj", "classifier": "head", "license": "apache-2.0", **kwargs,
    }


default_cfgs = generate_default_cfgs({name: _cfg() for name in VARIANTS})


#: timm's ``pretrained_filter_fn`` of every variant (``set_checkpoint_filter``)
_checkpoint_filter: Optional[Callable[..., Dict[str, Any]]] = None


def set_checkpoint_filter(fn: Callable[..., Dict[str, Any]]):
    """Make ``fn(state_dict, model, allow_partial)`` the filter timm applies to pretrained weights
    (the package sets ``checkpoint.checkpoint_filter_fn``: the core imports nothing of it)."""
    global _checkpoint_filter
    _checkpoint_filter = fn


def create_srvit(variant: str, pretrained: bool = False, **kwargs) -> SRViT:
    """Build a named variant through timm's ``build_model_with_cfg``.

    Args:
        variant: a name of ``VARIANTS``.
        pretrained: load the weights of ``pretrained_cfg_overlay=dict(file=PATH)``.
        kwargs: ``SRViT`` arguments overriding the variant's, or timm's (``features_only``, ``out_indices``,
            ``pretrained_cfg_overlay``, ``pretrained_strict``: False loads a partial checkpoint).

    Raises:
        ValueError: an unknown variant or argument values the model refuses.
    """
    args = variant_args(variant)
    args.update(kwargs)
    layout = resolve_layout(args["layout"], args["num_middle_blocks"])
    overlay = dict(args.pop("pretrained_cfg_overlay", None) or {})
    strict = args.pop("pretrained_strict", True)
    if args.get("distilled"):
        overlay.setdefault("classifier", ("head", "head_dist"))
    return build_model_with_cfg(
        SRViT, variant, pretrained,
        pretrained_filter_fn=partial(_checkpoint_filter, allow_partial=not strict),
        pretrained_strict=strict,
        pretrained_cfg_overlay=overlay or None,
        feature_cfg=dict(out_indices=default_out_indices(layout, args["num_steps"], args.get("ordinary_blocks", True),
                                                         args.get("step_features", False)),
                         feature_cls="getter"),
        **args,
    )


def _register(name: str):
    def fn(pretrained: bool = False, **kwargs) -> SRViT:
        return create_srvit(name, pretrained=pretrained, **kwargs)
    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f"{'bViT' if name.startswith('bvit') else 'SR-ViT'} variant ``{name}``: {VARIANTS[name]}"
    return register_model(fn)


for _name in VARIANTS:
    globals()[_name] = _register(_name)
