"""Index tensors and constant blocks made from sizes alone, made once per argument set and kept."""
import functools

import torch


def size_constants(make):
    """``make`` cached for the process: a GPU would otherwise build the same index every
    application (with a host-to-device copy and a stream sync where it is made on the host).

    Args:
        make: a function of hashable arguments (sizes, dtypes, a device) returning tensors.

    Returns:
        The cached function (with ``cache_clear`` and ``cache_info``): made outside
        ``inference_mode`` (a tensor first made in evaluation serves a later backward), and anew
        while ``torch.compile`` traces (a cached tensor would be a graph constant).
    """
    @functools.lru_cache(maxsize=None)
    def cached(*args):
        with torch.inference_mode(False):
            return make(*args)

    @functools.wraps(make)
    def get(*args):
        return make(*args) if torch.compiler.is_compiling() else cached(*args)

    get.cache_clear, get.cache_info = cached.cache_clear, cached.cache_info
    return get
