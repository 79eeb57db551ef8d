"""Index tensors and constant blocks made from sizes alone, made once per argument set and kept."""
import functools

import torch


def size_constants(make):
    """``make`` (a function of hashable sizes, dtypes, a device) cached for the process, so a GPU does not build the
    same index every application; made outside ``inference_mode`` (a tensor made in evaluation serves a later
    backward) and anew while ``torch.compile`` traces (a cached tensor would be a graph constant)."""
    @functools.lru_cache(maxsize=None)
    def cached(*args):
        with torch.inference_mode(False):
            return make(*args)

    @functools.wraps(make)
    def get(*args):
        return make(*args) if torch.compiler.is_compiling() else cached(*args)

    get.cache_clear, get.cache_info = cached.cache_clear, cached.cache_info
    return get
