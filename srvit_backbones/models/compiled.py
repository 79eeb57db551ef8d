"""``torch.compile`` of the dense-feature path (``SRViT.forward_feature_maps``), the one switch
every framework adapter passes on: ``compile`` of detectron2's ``SRViTBackbone``
(``model.backbone.net.compile``) and of the OpenMMLab one (``model.backbone.compile`` in mmdet
and mmseg configs). Only the backbone is compiled: its graph has no data-dependent shapes (a
fixed input size gives one graph), whereas a detector's heads (proposals, sampling, NMS) do.

The compiled function is a module-level one that takes the model as an argument, so nothing
compiled is held by a model: a deep copy (an EMA model) or a loaded checkpoint runs its own
weights, and dynamo (which inlines modules' code and guards on their attributes) shares the
graph between models of the same shape.
"""
import inspect
from collections.abc import Mapping
from typing import Callable, Dict, Optional, Sequence, Union

import torch

#: the switch: False (eager), True (torch.compile's defaults: inductor) or torch.compile's
#: keyword arguments, as mmengine's ``cfg.compile`` takes them
CompileSetting = Union[bool, Mapping, None]


def compile_options(compile: CompileSetting) -> Optional[Dict]:
    """torch.compile's keyword arguments for the setting (None: eager); a ValueError naming the
    accepted values, or the argument torch.compile does not take."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return {}
    if isinstance(compile, Mapping):
        options = dict(compile)
        try:
            inspect.signature(torch.compile).bind(None, **options)
        except TypeError as e:
            raise ValueError(f"compile={options!r}: {e}; the dict holds torch.compile's keyword arguments "
                             f"(backend, mode, fullgraph, dynamic, options)") from None
        return options
    raise ValueError(f"compile={compile!r}: give False (eager), True (torch.compile's defaults: inductor) or a "
                     f"dict of torch.compile's arguments, e.g. dict(mode='max-autotune') or dict(backend='aot_eager')")


def feature_maps(model: torch.nn.Module, x: torch.Tensor, indices: Sequence[int]) -> Dict[str, torch.Tensor]:
    """``model.forward_feature_maps(x, indices)``: the function ``feature_maps_function`` compiles."""
    return model.forward_feature_maps(x, indices=indices)


_compiled: Dict[str, Callable] = {}


def feature_maps_function(options: Optional[Dict]) -> Callable:
    """``feature_maps``, compiled with ``options`` (``compile_options``'s result; None: eager).
    One compiled function per setting in the process."""
    if options is None:
        return feature_maps
    key = repr(sorted(options.items()))
    if key not in _compiled:
        _compiled[key] = torch.compile(feature_maps, **options)
    return _compiled[key]
