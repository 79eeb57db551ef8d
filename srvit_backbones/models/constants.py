"""Index tensors and constant blocks made from sizes alone (relative offsets, window orders,
the folded kernel's gather index and one-hots), made once per argument set and kept."""
import functools

import torch


def size_constants(make):
    """``make(*args)`` (hashable arguments: sizes, dtypes, a device) cached for the process: a
    GPU would otherwise build the same index every application, with a host-to-device copy and a
    stream sync where it is made on the host. Made outside ``inference_mode``, so that a tensor
    first made in evaluation can be saved for a later training step's backward; made anew in the
    graph while ``torch.compile`` traces (a cached tensor would be a constant of the graph).
    ``cache_clear`` and ``cache_info`` are the cache's."""
    @functools.lru_cache(maxsize=None)
    def cached(*args):
        with torch.inference_mode(False):
            return make(*args)

    @functools.wraps(make)
    def get(*args):
        return make(*args) if torch.compiler.is_compiling() else cached(*args)

    get.cache_clear, get.cache_info = cached.cache_clear, cached.cache_info
    return get
