"""The backbones a benchmark times (SR-ViT variants, their same-depth anchors, timm models) and their steps."""
import ast
import functools
import inspect

import timm
import torch

from ... import SRViT
from ...training import amp
from .timing import train_step

REFERENCE_SAME_DEPTH = "vit_same_depth"
REFERENCE_VITDET = "vitdet_same_depth"
SAME_DEPTH = (REFERENCE_SAME_DEPTH, REFERENCE_VITDET)
SET_BY_TOOL = ("img_size", "num_classes")  # core arguments the benchmark sets itself


def parse_variant(spec):
    """``NAME:key=value,...`` -> (NAME, {key: value}), values read as Python literals.

    Raises:
        ValueError: naming the problem and the expected form.
    """
    form = "expected NAME:key=value,... (e.g. win:window_size=14,use_rel_pos=True; 'global:' for no arguments)"
    name, sep, rest = spec.partition(":")
    name = name.strip()
    if not sep or not name or not all(c.isalnum() or c in "_.-" for c in name):
        raise ValueError(f"--variant {spec!r}: {form}")
    try:
        call = ast.parse(f"f({rest})", mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"--variant {spec!r}: {e.msg}; {form}") from None
    if call.args or any(kw.arg is None for kw in call.keywords):
        raise ValueError(f"--variant {spec!r}: every argument needs a name; {form}")
    kwargs = {}
    for kw in call.keywords:
        try:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
        except ValueError:
            raise ValueError(f"--variant {spec!r}: the value of {kw.arg} is not a Python literal "
                             f"({ast.unparse(kw.value)}); quote strings: {kw.arg}='...'") from None
    known = [p for p in inspect.signature(SRViT).parameters if p not in SET_BY_TOOL]
    for key in kwargs:
        if key in SET_BY_TOOL:
            raise ValueError(f"--variant {spec!r}: {key} is set by the benchmark (--size, and a 1000-class head "
                             f"only at 224); leave it out")
        if key not in known:
            raise ValueError(f"--variant {spec!r}: {key!r} is not an SRViT argument; known: {', '.join(known)}")
    return name, kwargs


def windowed_variant(variants):
    """The core arguments of the first variant with windows (None if there is none)."""
    return next((kwargs for _, kwargs in variants if kwargs.get("window_size")), None)


def build(kind, name, size, grad_ckpt, model_args=None):
    """The model of a benchmark row of ``kind``: ``srvit`` or ``timm`` (``name`` with ``model_args``), or
    an anchor of ``name``'s applications (REFERENCE_SAME_DEPTH; REFERENCE_VITDET of the windowed
    ``model_args``). A 1000-class head at 224, none elsewhere."""
    num_classes = 1000 if size == 224 else 0
    if kind == REFERENCE_VITDET:
        from ...detectron2.benchmark import vitdet_same_depth  # needs detectron2

        return vitdet_same_depth(timm.create_model(name, img_size=size, num_classes=0, **model_args), size, grad_ckpt)
    if kind == REFERENCE_SAME_DEPTH:
        ref = timm.create_model(name, img_size=size, num_classes=0)
        model = timm.models.vision_transformer.VisionTransformer(
            img_size=size, patch_size=16, embed_dim=ref.embed_dim, depth=ref.effective_depth,
            num_heads=ref.units[0].blocks[0].attn.num_heads, num_classes=num_classes)
    else:
        model = timm.create_model(name, img_size=size, num_classes=num_classes, **(model_args or {}))
    model.set_grad_checkpointing(grad_ckpt)
    return model


def backbone_step(model, mode, inputs, amp_dtype=None):
    """A function running one ``infer`` or ``train`` step (mean-square loss, AdamW) of ``model`` on
    ``inputs``, autocast to ``amp_dtype`` if given."""
    autocast = functools.partial(amp.autocast, str(inputs.device), amp_dtype is not None, amp_dtype)
    if mode == "infer":
        model.eval()

        def step():
            with torch.inference_mode(), autocast():
                model(inputs)
        return step
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with autocast():
            out = model(inputs)
        train_step(out.float().square().mean(), optimizer)
    return step
