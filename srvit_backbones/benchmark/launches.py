"""Kernel launches counted without a GPU: the aten operations a piece of code dispatches, the
ones that do work on a device (on a GPU, about one kernel launch each). ``--attention`` prints
them beside each time, and the tests hold the relative-position kernels to a launch budget with
the GPU's choices run on the CPU (``device_type='cuda'``)."""
import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: operations that only allocate (no kernel runs) or only reinterpret metadata without being
#: marked as views in their schema
NO_LAUNCH = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view"})


def launches(func) -> bool:
    """Whether an aten operation does work on the device: not a view (an alias in its schema),
    not an allocation, and returning a tensor (``promote_types`` and the like return none)."""
    if func.is_view or func.overloadpacket.__name__ in NO_LAUNCH:
        return False
    return any(isinstance(r.type, torch.TensorType) or "Tensor" in str(r.type) for r in func._schema.returns)


class LaunchCounter(TorchDispatchMode):
    """Counts, by name, the operations dispatched inside it that ``launches``; ``total`` sums
    them. Views, allocations and Python-side work are not counted."""

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
