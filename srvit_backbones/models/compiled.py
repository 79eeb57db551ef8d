"""``torch.compile`` of the dense-feature path (``SRViT.forward_feature_maps``), the adapters' ``compile`` switch. The
compiled function is a module-level one that takes the model, so a deep copy (an EMA model) runs its own weights, and
models of one shape share a graph."""
import inspect
from collections.abc import Mapping
from typing import Callable, Dict, Optional, Sequence, Union

import torch

#: the switch: False (eager), True (torch.compile's defaults: inductor) or torch.compile's
#: keyword arguments, as mmengine's ``cfg.compile`` takes them
CompileSetting = Union[bool, Mapping, None]


def compile_options(compile: CompileSetting) -> Optional[Dict]:
    """torch.compile's keyword arguments of a ``compile`` setting.

    Args:
        compile: False / None (eager), True (torch.compile's defaults) or a dict of its arguments.

    Returns:
        The keyword arguments, or None for eager.

    Raises:
        ValueError: another value, or an argument torch.compile does not take.
    """
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
    """``feature_maps`` compiled with ``compile_options``'s ``options`` (None: eager), once per setting."""
    if options is None:
        return feature_maps
    key = repr(sorted(options.items()))
    if key not in _compiled:
        _compiled[key] = torch.compile(feature_maps, **options)
    return _compiled[key]
