"""Let ``torch.load(weights_only=True)`` read mmengine's checkpoints (an entry point of setup.py)."""
import pickle

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def history_buffer_attribute(obj, name):
    """The only ``getattr`` an mmengine checkpoint needs: a HistoryBuffer method."""
    if obj is HistoryBuffer and not name.startswith("_") and callable(getattr(HistoryBuffer, name, None)):
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(f"refusing getattr({obj!r}, {name!r}) while loading a checkpoint")


def allow_mmengine_checkpoints():
    """Allow-list the types of an mmengine checkpoint's message hub for ``torch.load(weights_only=True)``."""
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    torch.serialization.add_safe_globals([HistoryBuffer, _reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes,
                                          (history_buffer_attribute, "builtins.getattr")])


allow_mmengine_checkpoints()
