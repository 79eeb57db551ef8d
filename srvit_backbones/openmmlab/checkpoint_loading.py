"""Let torch >= 2.6 (``weights_only=True`` by default) load mmengine's own checkpoints.

mmengine saves its ``MessageHub`` (``HistoryBuffer`` objects holding numpy arrays) in every
checkpoint and loads them with a plain ``torch.load``, so ``--resume``, ``load_from`` and
``tools/test.py`` fail with "Weights only load failed". Instead of turning the safety check
off, the few types those checkpoints contain are allow-listed. HistoryBuffer's statistics
methods are pickled as ``getattr(HistoryBuffer, 'min')``: instead of allowing ``getattr``
itself, the pickle's ``getattr`` is mapped to a function that only resolves those methods.

Registered on import, and declared in setup.py as the ``mmengine`` entry of
``srvit_backbones.checkpoint_types``: ``checkpoint.read_checkpoint`` runs it when torch refuses an
mmengine type, so any tool reads an mmseg / mmdet ``iter_N.pth`` without importing the adapter.
"""
import pickle

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def _numpy_globals():
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes]


def history_buffer_attribute(obj, name):
    """The only ``getattr`` an mmengine checkpoint needs: a HistoryBuffer method."""
    if obj is HistoryBuffer and not name.startswith("_") and callable(getattr(HistoryBuffer, name, None)):
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(f"refusing getattr({obj!r}, {name!r}) while loading a checkpoint")


def allow_mmengine_checkpoints():
    """Allow-list the types of an mmengine checkpoint's message hub for ``torch.load(weights_only=True)``."""
    torch.serialization.add_safe_globals([HistoryBuffer, *_numpy_globals(),
                                          (history_buffer_attribute, "builtins.getattr")])


allow_mmengine_checkpoints()
