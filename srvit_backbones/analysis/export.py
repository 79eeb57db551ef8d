"""ONNX export of the dense SR-ViT backbone (its ``features_only`` outputs ``unit{i}``), by
``torch.onnx.export(dynamo=True)`` with dynamic batch, height and width (multiples of the patch size),
checked against PyTorch with ONNX Runtime. Global attention without relative positions only; the graph
is fp32 (``--amp`` adds bf16 autocast to the check). Needs ``pip install -e .[deploy]``.
"""
import argparse
import ast
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..checkpoint import LoadReport, extract_state_dict, load_pretrained, read_checkpoint, select_backbone
from ..errors import CheckpointError, SRViTError
from ..models import create_srvit
from ..models.rules import split_pos_embed
from ..training.amp import autocast
from .demo import check_device

#: constructor arguments that the tool sets itself (options of their own)
RESERVED = ("features_only", "img_size", "out_indices", "num_classes", "pretrained")


class ExportError(SRViTError, RuntimeError):
    """The export or its check cannot be done as asked; the message says why."""


def table_img_size(checkpoint: Mapping[str, Any], patch_size: int = 16) -> Optional[int]:
    """The image size of the checkpoint's (square) position table, None if it holds none.

    Raises:
        CheckpointError: a position table of no square grid."""
    sd = select_backbone(extract_state_dict(checkpoint), None, LoadReport())
    pos_embed = sd.get("pos_embed")
    if pos_embed is None:
        return None
    try:  # class token, + distillation token, none (windowed / relative positions)
        return split_pos_embed(pos_embed.shape[1])[1] * patch_size
    except ValueError as e:
        raise CheckpointError(f"the checkpoint's {e}") from None


def build_backbone(variant: str, checkpoint: Optional[Mapping[str, Any]] = None, img_size: Optional[int] = None,
                   out_indices: Optional[Sequence[int]] = None,
                   overrides: Optional[Dict[str, Any]] = None) -> Tuple[nn.Module, Optional[LoadReport]]:
    """(the ``features_only`` backbone in eval mode with the weights of ``checkpoint`` (None: random),
    its position table at the checkpoint's size unless ``img_size`` is given; the ``LoadReport``).

    Raises:
        ExportError: ``overrides`` set a reserved argument, or the model has windows / relative positions."""
    overrides = dict(overrides or {})
    reserved = sorted(set(overrides) & set(RESERVED))
    if reserved:
        raise ExportError(f"{reserved} cannot be overridden: use the tool's own options (--img-size, --out-indices)")
    if img_size is None:
        img_size = (table_img_size(checkpoint) if checkpoint is not None else None) or 224
    kwargs = dict(overrides, features_only=True, img_size=img_size)
    if out_indices is not None:
        kwargs["out_indices"] = tuple(out_indices)
    backbone = create_srvit(variant, **kwargs)
    model = backbone.model
    if model.window_size or model.use_rel_pos:
        raise ExportError("dynamic-size ONNX export supports global attention without relative positions "
                          "(window_size=0, use_rel_pos=False): with them torch.export specialises the graph to one "
                          "input size (timm's window partition and relative-position lookup size it in Python), so "
                          "windowed / relative-position models cannot be exported by this tool yet")
    report = load_pretrained(model, checkpoint) if checkpoint is not None else None
    return backbone.eval(), report


def output_names(backbone: nn.Module) -> List[str]:
    """The name of each feature in ``feature_info`` order, as ``forward_feature_maps`` keys it."""
    return [backbone.model.feature_name(i) for i in backbone.feature_info.out_indices]


def export_onnx(backbone: nn.Module, path: str, opset: int = 18) -> None:
    """Write ``backbone`` to ``path`` as one ONNX file, dynamic batch, height and width."""
    p = backbone.model.patch_size
    batch = torch.export.Dim("batch", min=1, max=1024)
    h, w = torch.export.Dim("h", min=1, max=4096 // p), torch.export.Dim("w", min=1, max=4096 // p)
    example = torch.randn(2, 3, 4 * p, 3 * p)  # non-square and not 1: no dimension is specialised
    with torch.no_grad():
        torch.onnx.export(backbone, (example,), path, dynamo=True, external_data=False, opset_version=opset,
                          input_names=["images"], output_names=output_names(backbone),
                          dynamic_shapes={"x": {0: batch, 2: p * h, 3: p * w}})


def check_onnx(path: str, backbone: nn.Module, sizes: Sequence[Tuple[int, int]], atol: float = 1e-4,
               rtol: float = 1e-4, seed: int = 0, amp: bool = False) -> List[Dict[str, Any]]:
    """Run the ONNX file (ONNX Runtime, CPU) and ``backbone`` on random images at each size (batch 1,
    2, ...). Returns a row per size: the largest absolute difference, whether each output's is within
    ``atol + rtol * max|torch|``; with ``amp`` also bf16 autocast's difference, not held to it.

    Raises:
        ExportError: the file has other outputs or shapes than ``backbone``."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    if names != output_names(backbone):
        raise ExportError(f"{path} returns {names}, the backbone {output_names(backbone)}: another model?")
    rows = []
    generator = torch.Generator().manual_seed(seed)
    for batch, (height, width) in enumerate(sizes, start=1):
        x = torch.randn(batch, 3, height, width, generator=generator)
        with torch.no_grad():
            expected = backbone(x)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        max_diff, ok = 0.0, True
        for name, ref, out in zip(names, expected, got):
            out = torch.from_numpy(out)
            if out.shape != ref.shape:
                raise ExportError(f"{name} at {height}x{width}: ONNX Runtime gives shape {tuple(out.shape)}, "
                                  f"PyTorch {tuple(ref.shape)}")
            diff = (out - ref).abs().max().item()
            max_diff = max(max_diff, diff)
            ok = ok and diff <= atol + rtol * ref.abs().max().item()
        row = dict(size=(height, width), batch=batch, max_abs_diff=max_diff, ok=ok)
        if amp:
            with torch.no_grad(), autocast("cpu", True):
                low = backbone(x)
            diffs = [((torch.from_numpy(out) - ref.float()).abs().max().item(), abs(out).max().item())
                     for out, ref in zip(got, low)]
            row["amp_max_abs_diff"] = max(d for d, _ in diffs)
            row["amp_max_rel_diff"] = max(d / scale for d, scale in diffs)
        rows.append(row)
    return rows


def parse_size(text: str) -> Tuple[int, int]:
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are HEIGHTxWIDTH, e.g. 224x320; got {text!r}") from None
    return height, width


def parse_override(text: str) -> Tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"model overrides are KEY=VALUE (e.g. num_steps=4); got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value  # a plain string, e.g. layout=fine_grained


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="export_onnx.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="SR-ViT variant, e.g. srvit_s_t3")
    parser.add_argument("--checkpoint", help="weights: a tools/pretrain.py checkpoint, detectron2 model_final.pth, "
                                             "mmseg iter_N.pth, a timm/DeiT state dict, .safetensors")
    parser.add_argument("--random-weights", action="store_true", help="export random weights (no --checkpoint)")
    parser.add_argument("--output", required=True, help="the .onnx file to write")
    parser.add_argument("--img-size", type=int, default=None,
                        help="position-table size (default: the checkpoint's, so the export computes what the "
                             "trained model does; 224 with --random-weights)")
    parser.add_argument("--out-indices", type=int, nargs="+", default=None,
                        help="units to return (default: the variant's feature_info, the recursive units)")
    parser.add_argument("--set", dest="overrides", type=parse_override, nargs="+", default=[], metavar="KEY=VALUE",
                        help="model arguments, as for timm.create_model (e.g. num_steps=4 embed_dim=32)")
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset (default 18)")
    parser.add_argument("--check-sizes", type=parse_size, nargs=2, default=[(224, 224), (192, 320)],
                        metavar="HxW", help="the two input sizes checked with ONNX Runtime (default 224x224 192x320)")
    parser.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance of the check")
    parser.add_argument("--rtol", type=float, default=1e-4,
                        help="relative tolerance of the check, times each output's largest magnitude")
    parser.add_argument("--amp", action="store_true",
                        help="also run the check's PyTorch model under bf16 autocast on the CPU and print its "
                             "difference to the (fp32) ONNX outputs; the exported graph stays fp32")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """tools/export_onnx.py's export and check of ``argv``; returns the check's rows.

    Raises:
        ExportError: the export or its check cannot be done, or ONNX Runtime's outputs differ.
        CheckpointError: the checkpoint cannot be read or does not fit.
        ConfigError: ``--amp`` on a CPU without native bf16."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.checkpoint and args.random_weights:
        parser.error("--checkpoint and --random-weights exclude each other")
    if not args.checkpoint and not args.random_weights:
        parser.error("--checkpoint is required (a pretraining, detectron2 or mmseg checkpoint); "
                     "pass --random-weights to export random weights on purpose")
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ExportError(f"ONNX export needs onnx, onnxscript and onnxruntime ({e}): "
                          f"pip install -e .[deploy]") from None
    check_device("cpu", args.amp)
    checkpoint = read_checkpoint(args.checkpoint) if args.checkpoint else None
    backbone, report = build_backbone(args.model, checkpoint, args.img_size, args.out_indices, dict(args.overrides))
    patch = backbone.model.patch_size
    bad = [f"{h}x{w}" for h, w in args.check_sizes if h % patch or w % patch]
    if bad:
        raise ExportError(f"check sizes {bad} are not multiples of the patch size {patch}")
    print(f"weights: {args.checkpoint}\n{report.summary()}" if report else "weights: random (--random-weights)")
    export_onnx(backbone, args.output, args.opset)
    print(f"wrote {args.output}: {args.model}, input images (batch, 3, H, W) with H, W multiples of {patch}, "
          f"outputs {', '.join(output_names(backbone))} (stride {patch}), position table "
          f"{backbone.model.pretrain_grid[0]}x{backbone.model.pretrain_grid[1]}")
    if args.amp:
        print("--amp: the exported graph stays fp32; the check also runs PyTorch under bf16 autocast (CPU)")
    rows = check_onnx(args.output, backbone, args.check_sizes, args.atol, args.rtol, amp=args.amp)
    for row in rows:
        print(f"check {row['size'][0]}x{row['size'][1]} (batch {row['batch']}): max abs difference ONNX Runtime vs "
              f"PyTorch {row['max_abs_diff']:.3g} ({'within' if row['ok'] else 'ABOVE'} atol {args.atol:g} + "
              f"rtol {args.rtol:g} * max|PyTorch| of each output)")
        if args.amp:
            print(f"check {row['size'][0]}x{row['size'][1]} (batch {row['batch']}): max abs difference PyTorch bf16 "
                  f"autocast vs ONNX Runtime fp32 {row['amp_max_abs_diff']:.3g} ({100 * row['amp_max_rel_diff']:.2g}% "
                  f"of max|output|; what bf16 costs, not held to the tolerance)")
    if not all(row["ok"] for row in rows):
        raise ExportError(f"ONNX Runtime's outputs differ from PyTorch's beyond the tolerance; "
                          f"{args.output} was written but should not be used")
    return rows
