"""SR-ViT as a detectron2 ``Backbone``: like ViTDet's ``ViT`` it outputs stride-16 maps and is
wrapped by detectron2's own ``SimpleFeaturePyramid`` in the configs."""
from functools import partial
from typing import Sequence

from detectron2.layers import ShapeSpec
from detectron2.modeling import Backbone
from detectron2.solver import get_default_optimizer_params
from omegaconf import OmegaConf

from ..layer_decay import lr_decay_factor, weight_decay_exemptions
from ..models import create_srvit
from ..models.compiled import compile_options, feature_maps_function


class SRViTBackbone(Backbone):
    """Args:
        variant: a named variant (``srvit_s_t3``, ``srvit_deit_s``, ``bvit_b``, ...).
        img_size: size of the position-embedding table (1024 for LSJ).
        out_features: among ``last_feat`` and the core's ``unit{i}`` / ``step{i}`` (bViT); the core is cut
            after the last requested one (DDP rejects parameters that get no gradient).
        drop_path_rate: stochastic depth over the effective depth.
        use_act_checkpoint: checkpoint every block application (non-reentrant).
        prefer_ema, allow_partial: read by ``SRViTCheckpointer`` (``load_pretrained``'s arguments).
        compile: ``torch.compile`` the backbone: True, or a dict of its arguments (heads stay eager).
        **overrides: any other core argument (``num_steps``, ``layout``, ``window_size``...).
    """

    def __init__(self, variant: str = "srvit_s_t3", img_size: int = 1024,
                 out_features: Sequence[str] = ("last_feat",), drop_path_rate: float = 0.1,
                 use_act_checkpoint: bool = False, prefer_ema: bool = False, allow_partial: bool = False,
                 compile=False, **overrides):
        super().__init__()
        if OmegaConf.is_config(compile):  # a dict given by a LazyConfig
            compile = OmegaConf.to_container(compile)
        self.compile_options = compile_options(compile)
        self.srvit = create_srvit(variant, img_size=img_size, num_classes=0, global_pool="",
                                  drop_path_rate=drop_path_rate, **overrides)
        self.srvit.set_grad_checkpointing(use_act_checkpoint)
        core = self.srvit
        features = {core.feature_name(i): i for i in range(len(core.feature_points))}
        unknown = [f for f in out_features if f != "last_feat" and f not in features]
        if not out_features or unknown:
            raise ValueError(f"out_features {list(out_features)}: unknown {unknown}; choose from "
                             f"{['last_feat'] + list(features)} (dense-prediction default: "
                             f"{[core.feature_name(i) for i in core.default_feature_indices]})")
        self._out_features = list(out_features)
        self._feature_indices = [features[f] for f in out_features if f != "last_feat"]
        # layer-decay ids count the whole network, before the cut (the same factors whatever is returned)
        self.layer_decay_unit_sizes = list(self.srvit.unit_sizes)
        last = len(core.feature_points) - 1 if "last_feat" in out_features else max(self._feature_indices)
        # ViTDet's ViT has no final norm (the SFP normalises)
        self.srvit.prune_intermediate_layers([last], prune_norm=True)
        stride = self.srvit.patch_size
        self._out_feature_channels = {f: self.srvit.embed_dim for f in out_features}
        self._out_feature_strides = {f: stride for f in out_features}
        self.prefer_ema = prefer_ema
        self.allow_partial = allow_partial

    @property
    def size_divisibility(self) -> int:
        return self.srvit.patch_size

    def forward(self, x):
        feats = feature_maps_function(self.compile_options)(self.srvit, x, self._feature_indices)
        return {f: feats[f] for f in self._out_features}

    def output_shape(self):
        return {f: ShapeSpec(channels=self._out_feature_channels[f], stride=self._out_feature_strides[f])
                for f in self._out_features}


def find_srvit_backbone(model):
    """(name, module) of the one ``SRViTBackbone`` inside ``model``."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, SRViTBackbone)]
    if len(found) != 1:
        raise ValueError(f"expected one SRViTBackbone in the model, found {len(found)}: "
                         f"{[name for name, _ in found]}; build the detector with "
                         f"model.backbone.net = L(SRViTBackbone)(...) (see detectron2_configs/)")
    return found[0]


# a convention's exempt kinds (layer_decay.WEIGHT_DECAY_CONVENTIONS) in detectron2's terms
_WEIGHT_DECAY_KNOB_OF_KIND = {"norm": "weight_decay_norm", "bias": "weight_decay_bias"}


def srvit_optimizer_params(model, lr_decay: float = 0.7, weight_decay_convention: str = "norms", overrides=None,
                           **kwargs):
    """detectron2's ``get_default_optimizer_params`` with layer-wise lr decay and the no-weight-decay
    names of the SR-ViT backbone inside ``model`` as built; ``params.model`` is set by the training script.

    Args:
        lr_decay: factor per layer id.
        weight_decay_convention: ``layer_decay.WEIGHT_DECAY_CONVENTIONS``, set as ``weight_decay_norm`` /
            ``weight_decay_bias`` = 0.
        overrides: by parameter name (its last component), over the no-weight-decay ones.
        **kwargs: ``get_default_optimizer_params``' other arguments.
    Raises:
        ValueError: ``weight_decay_norm`` / ``weight_decay_bias`` contradicting the convention.
    """
    for kind in weight_decay_exemptions(weight_decay_convention):
        knob = _WEIGHT_DECAY_KNOB_OF_KIND[kind]
        if kwargs.get(knob) not in (None, 0.0):
            raise ValueError(f"{knob}={kwargs[knob]} contradicts weight_decay_convention={weight_decay_convention!r}, "
                             f"which gives {kind}s no weight decay: remove {knob} or choose another convention")
        kwargs[knob] = 0.0
    name, backbone = find_srvit_backbone(model)
    prefix = f"{name}.srvit." if name else "srvit."
    factor = partial(lr_decay_factor, decay=lr_decay, unit_sizes=backbone.layer_decay_unit_sizes, prefix=prefix)
    no_decay = {n.rsplit(".", 1)[-1]: {"weight_decay": 0.0} for n in backbone.srvit.no_weight_decay()}
    return get_default_optimizer_params(model, lr_factor_func=factor, overrides={**no_decay, **(overrides or {})},
                                        **kwargs)
