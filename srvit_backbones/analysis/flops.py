"""Parameter and FLOP counting, fvcore-style (one multiply-add = one FLOP), fused attention included;
block applications of a recursive backbone traced once each (``BlockApplications``), a model's neck and
heads once per config (``count_parts``): docs/detectron2.md."""
import copy
import importlib
import math
import warnings
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Tuple

import torch
import torch.nn as nn

from ..models import softmor

SDPA_OP = "aten::scaled_dot_product_attention"
APPLY_BLOCK = softmor.apply_block  # what a block application runs, also while BlockApplications records them
ATTENTION = SDPA_OP.split("::")[1]  # its key in a count by operator


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """fvcore / mmengine flop handle of ``aten::scaled_dot_product_attention``: q @ k^T and attn @ v."""
    q, k, v = (t.type().sizes() for t in inputs[:3])
    *batch, n_q, d = q
    n_k, d_v, b = k[-2], v[-1], math.prod(batch)
    return b * n_q * n_k * d + b * n_q * n_k * d_v


def count_fused_attention() -> None:
    """Add ``sdpa_flop_jit`` to fvcore's and mmengine's default op handles (a handle already there is
    kept), so that the frameworks' own FLOP tools run in this process count fused attention."""
    for module, table in (("fvcore.nn.flop_count", "_DEFAULT_SUPPORTED_OPS"),
                          ("mmengine.analysis.complexity_analysis", "_DEFAULT_SUPPORTED_FLOP_OPS")):
        try:
            handles = getattr(importlib.import_module(module), table)
        except ImportError:
            continue
        handles.setdefault(SDPA_OP, sdpa_flop_jit)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_by_operator(model: nn.Module, inputs: Any, analysis: Optional[Callable] = None) -> Counter:
    """FLOPs of ``model(*inputs)`` by operator: one trace by ``analysis`` (fvcore's), in eval mode."""
    if analysis is None:
        from fvcore.nn import FlopCountAnalysis as analysis
    was_training = model.training
    model.eval()
    try:
        counter = analysis(model, inputs).set_op_handle(SDPA_OP, sdpa_flop_jit)
        counter.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", FutureWarning)  # torch.jit deprecation, from fvcore's tracer
            return Counter(counter.by_operator())
    finally:
        model.train(was_training)


def attention_split(by_operator: Counter) -> Tuple[int, int]:
    """(all, fused attention) FLOPs of a count by operator."""
    return int(sum(by_operator.values())), int(by_operator.get(ATTENTION, 0))


def _sizes(sizes) -> Optional[Tuple[int, ...]]:
    """Sizes as ints: a trace gives them as tensors."""
    return None if sizes is None else tuple(int(s) for s in sizes)


def _configuration(module: nn.Module) -> Hashable:
    """What a module computes, weights aside: structure, tensor shapes, plain attributes."""
    plain = (bool, int, float, str, type(None))
    tensors = [(n, _sizes(t.shape), t.dtype) for n, t in (*module.named_parameters(), *module.named_buffers())]
    attributes = [(name, sorted((k, v) for k, v in vars(m).items()
                                if not k.startswith("_") and k != "training" and isinstance(v, plain)))
                  for name, m in module.named_modules()]
    return repr(module), tuple(tensors), repr(attributes)


class _Application(nn.Module):
    """One block application as a module fvcore can trace."""

    def __init__(self, block: nn.Module, arguments: Tuple):
        super().__init__()
        self.block, self.arguments = block, arguments

    def forward(self, x):
        return APPLY_BLOCK(self.block, x, *self.arguments)


class BlockApplications:
    """While active (``with``), SR-ViT's block applications are recorded, not run; ``by_operator()``
    traces each distinct one once (``traced``: a shareable cache), times how often it ran."""

    def __init__(self, analysis: Optional[Callable] = None, traced: Optional[Dict[Hashable, Counter]] = None):
        self.analysis = analysis
        self.traced = {} if traced is None else traced
        self.runs: Counter = Counter()
        self.examples: Dict[Hashable, Tuple[nn.Module, torch.Tensor, Tuple]] = {}

    def __enter__(self):
        softmor.apply_block = self._record
        return self

    def __exit__(self, *exc):
        softmor.apply_block = APPLY_BLOCK

    def _record(self, block: nn.Module, x: torch.Tensor, drop_prob: float, training: bool,
                grid: Optional[Tuple[int, int]] = None, window_size: int = 0,
                attn_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        key = (_configuration(block), _sizes(x.shape), x.dtype, _sizes(grid), window_size,
               None if attn_bias is None else _sizes(attn_bias.shape))
        self.runs[key] += 1
        if key not in self.examples:
            bias = None if attn_bias is None else torch.zeros_like(attn_bias)
            self.examples[key] = (block, torch.zeros_like(x), (drop_prob, training, _sizes(grid), window_size, bias))
        return x

    def by_operator(self) -> Counter:
        """FLOPs of the recorded applications by operator."""
        total = Counter()
        for key, runs in self.runs.items():
            if key not in self.traced:
                block, x, arguments = self.examples[key]
                if x.is_meta or any(p.is_meta for p in block.parameters()):  # built for its size only
                    block, x = copy.deepcopy(block).to_empty(device="cpu"), torch.zeros(x.shape, dtype=x.dtype)
                self.traced[key] = count_by_operator(_Application(block, arguments), (x,), self.analysis)
            for op, flops in self.traced[key].items():
                total[op] += runs * flops
        return total


def count_flops_by_operator(model: nn.Module, inputs: Any, analysis: Optional[Callable] = None,
                            plain: bool = False, traced: Optional[Dict[Hashable, Counter]] = None) -> Counter:
    """FLOPs of ``model(*inputs)`` by operator, by ``BlockApplications`` (``plain``: one whole trace)."""
    if plain:
        return count_by_operator(model, inputs, analysis)
    with BlockApplications(analysis, traced) as blocks:
        rest = count_by_operator(model, inputs, analysis)
    return rest + blocks.by_operator()


def count_flops(model: nn.Module, inputs: Tuple[torch.Tensor, ...], plain: bool = False,
                traced: Optional[Dict[Hashable, Counter]] = None) -> int:
    """Total FLOPs (multiply-adds) of ``model(*inputs)`` in eval mode, via fvcore."""
    return attention_split(count_flops_by_operator(model, inputs, plain=plain, traced=traced))[0]


@dataclass
class Counted:
    """Counts kept between configs: block applications, and neck plus heads by config and backbone shapes."""

    blocks: dict = field(default_factory=dict)
    heads: dict = field(default_factory=dict)


def _map_tensors(fn: Callable, tree: Any) -> Any:
    """``fn`` over the tensors of a nested dict / list / tuple."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _map_tensors(fn, v) for k, v in tree.items()}
    return type(tree)(_map_tensors(fn, v) for v in tree)


class _StandIn(nn.Module):
    """Zeros shaped like a backbone's output, in the backbone's place."""

    def __init__(self, output: Any):
        super().__init__()
        self.output = _map_tensors(torch.zeros_like, output)

    def forward(self, x):
        return _map_tensors(lambda t: x.new_zeros(t.shape, dtype=t.dtype), self.output)


def count_parts(model: nn.Module, inputs: Any, backbone_name: str, backbone_input: torch.Tensor, config: str,
                counted: Counted, analysis: Optional[Callable] = None,
                heads_counted: Callable = nullcontext) -> Counter:
    """FLOPs by operator of ``model(inputs)``, as one trace by ``analysis`` counts them: the backbone
    (submodule ``backbone_name``, called on ``backbone_input``) by ``count_flops_by_operator``, the
    rest with a ``_StandIn`` backbone once per ``config`` (without the backbone) and backbone shapes,
    inside ``heads_counted(model)``."""
    parent_name, _, name = backbone_name.rpartition(".")
    parent, backbone = model.get_submodule(parent_name), model.get_submodule(backbone_name)
    outputs = []
    hook = backbone.register_forward_hook(lambda module, args, output: outputs.append(output))
    try:
        counts = count_flops_by_operator(backbone, (backbone_input,), analysis, traced=counted.blocks)
    finally:
        hook.remove()
    key = (config, tuple(backbone_input.shape), repr(_map_tensors(lambda t: tuple(t.shape), outputs[0])))
    if key not in counted.heads:
        setattr(parent, name, _StandIn(outputs[0]))
        try:
            with heads_counted(model):
                counted.heads[key] = count_by_operator(model, inputs, analysis)
        finally:
            setattr(parent, name, backbone)
    return counts + counted.heads[key]


@contextmanager
def proposals_checked(nms: Any, threshold: str, module: nn.Module, proposals: Callable, expected: int):
    """A detector adapter's ``heads_counted`` for ``count_parts``: the RPN's NMS off (``nms.<threshold>``
    1.0: NMS has no FLOPs, and on zero features it would drop proposals); after the count, the box head
    must have run on the ``expected`` proposals (``proposals(args, output)`` of ``module``'s first call)."""
    seen, old = [], getattr(nms, threshold)
    setattr(nms, threshold, 1.0)
    hook = module.register_forward_hook(lambda m, args, output: seen.append(proposals(args, output)))
    try:
        yield
    finally:
        setattr(nms, threshold, old)
        hook.remove()
    got = seen[0] if seen else 0
    if got != expected:
        raise RuntimeError(f"the box head ran on {got} proposals, not the {expected} it runs on at "
                           f"test time: the count would be too low (count with --plain)")


def main(argv=None):
    """``python -m srvit_backbones.analysis.flops SCRIPT [ARGS...]``: run a framework's FLOP tool (SCRIPT,
    e.g. detectron2's tools/analyze_model.py) with fused attention counted."""
    import argparse
    import runpy
    import sys

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("script", help="the tool's .py file")
    p.add_argument("arguments", nargs=argparse.REMAINDER, help="its arguments")
    args = p.parse_args(argv)
    count_fused_attention()
    sys.argv = [args.script, *args.arguments]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
