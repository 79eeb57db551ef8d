"""tools/count_flops.py reproduces the paper's Table 2 at 224x224."""
import importlib.util
import os
from decimal import ROUND_HALF_UP, Decimal

import pytest
import torch

from srvit_backbones.flops import count_flops, sdpa_flop_jit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# paper Table 2: params (M), GFLOPs (ImageNet head included, 224x224)
TABLE2 = {
    "srvit_t_t2": (15.4, 5.4), "srvit_t_t3": (15.8, 7.8),
    "srvit_s_t2": (22.7, 8.5), "srvit_s_t3": (23.2, 12.4), "srvit_s_t4": (23.8, 16.3),
    "srvit_b_t2": (39.9, 14.8), "srvit_b_t3": (41.0, 21.6),
    "srvit_deit_s": (22.1, 4.6),
}


def half_up(x, places):
    return float(Decimal(str(x)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def load_tool():
    spec = importlib.util.spec_from_file_location("count_flops", os.path.join(ROOT, "tools", "count_flops.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_count_flops_reproduces_table2(capsys):
    rows = {r["model"]: r for r in load_tool().main(["--models", *TABLE2])}
    printed = capsys.readouterr().out
    for name, (params, gflops) in TABLE2.items():
        r = rows[name]
        assert name in printed
        # The paper prints one decimal; s_t2 (22.645M) and b_t3 (40.945M) are printed as 22.7
        # and 41.0, i.e. rounded to 0.01 first. Our counts agree with every figure under that
        # rounding, and are within 0.055M in any case.
        assert half_up(half_up(r["params_m"], 2), 1) == pytest.approx(params), name
        assert abs(r["params_m"] - params) < 0.055, name
        assert abs(r["gflops"] - gflops) / gflops < 0.02, (name, r["gflops"])
    assert rows["srvit_s_t3"]["d_eff"] == 32 and rows["srvit_s_t4"]["d_eff"] == 42


def test_sdpa_is_counted_like_explicit_attention():
    class Explicit(torch.nn.Module):
        def forward(self, q, k, v):
            return (q @ k.transpose(-2, -1)).softmax(-1) @ v

    class Fused(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    q, k, v = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 12, 8), torch.randn(2, 3, 12, 5)
    expected = 2 * 3 * 10 * 12 * 8 + 2 * 3 * 10 * 12 * 5
    assert count_flops(Explicit(), (q, k, v)) == expected
    assert count_flops(Fused(), (q, k, v)) == expected
    # the handle is what counts it: fvcore alone counts nothing for the fused op
    from fvcore.nn import FlopCountAnalysis

    assert FlopCountAnalysis(Fused(), (q, k, v)).unsupported_ops_warnings(False).total() == 0
    assert FlopCountAnalysis(Fused(), (q, k, v)).set_op_handle(
        "aten::scaled_dot_product_attention", sdpa_flop_jit).total() == expected
