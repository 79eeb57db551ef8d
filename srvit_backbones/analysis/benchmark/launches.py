"""Kernel launches counted without a GPU: the dispatched aten operations that do work (about one
launch each on a GPU); ``--attention`` prints them and the tests hold kernels to a budget."""
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: operations that only allocate or reinterpret metadata without being views in their schema
NO_LAUNCH = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view"})


def launches(func) -> bool:
    """Whether an aten operation does work: not a view, not an allocation, and returns a tensor."""
    if func.is_view or func.overloadpacket.__name__ in NO_LAUNCH:
        return False
    return any(isinstance(r.type, torch.TensorType) or "Tensor" in str(r.type) for r in func._schema.returns)


class LaunchCounter(TorchDispatchMode):
    """Counts by name (``ops``) the operations dispatched inside it that ``launches``; ``total`` sums them."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches(func):
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_launches(fn, *args, **kwargs) -> LaunchCounter:
    """The launches of one call ``fn(*args, **kwargs)`` (its result dropped)."""
    with LaunchCounter() as counter:
        fn(*args, **kwargs)
    return counter
