"""tools/gpu_check.py: without CUDA it runs the device-branch check with the GPU's choices
forced on the CPU and exits 0; every check's code runs on the CPU at a small size, the way
it runs on a GPU (the frameworks' AMP paths aside, which need CUDA)."""
import json

import pytest
import torch

from helpers import load_tool


def test_without_cuda_it_runs_the_branch_check_and_exits_0(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the default runs every check")
    assert load_tool("gpu_check").main(["--output", str(tmp_path / "check.json")]) == 0
    assert "no CUDA device here; running (e) only" in capsys.readouterr().out
    result = json.loads((tmp_path / "check.json").read_text())
    assert list(result["checks"]) == ["e"] and result["ok"]
    rows = result["checks"]["e"]["rows"]
    assert {row["case"].rsplit(", ", 1)[1] for row in rows} == {"padded_windows", "windows", "global"}
    assert all(row["ok"] and row["max_abs_diff"] <= 1e-5 for row in rows)
    with pytest.raises(SystemExit, match="--device cuda but no GPU is visible"):
        load_tool("gpu_check").main(["--device", "cuda"])


def test_every_check_runs_on_the_cpu(tmp_path, monkeypatch):
    """(a) both detectors through detectron2's trainer, (b) the mmseg step through its optim
    wrapper, (c) a pretraining step with --amp (bf16 inside the model, no GradScaler), (d) the
    benchmark's throughput rows next to the paper's."""
    from srvit_backbones import amp

    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)  # (c)'s bf16 branch on any CPU
    tool = load_tool("gpu_check")
    common = ["--device", "cpu", "--size", "64", "--steps", "1", "--warmup", "1", "--throughput-batch", "1"]
    assert tool.main([*common, "--checks", "a", "b", "c", "--output", str(tmp_path / "abc.json")]) == 0
    checks = json.loads((tmp_path / "abc.json").read_text())["checks"]
    detectors = checks["a"]["rows"]
    assert [row["config"] for row in detectors] == [tool.VITDET_B, *tool.DETECTORS]  # the anchor, in the same run
    assert all(row["trainer"] == "SimpleTrainer" and row["s_per_iter"] > 0 and len(row["times_s"]) == 2
               and torch.isfinite(torch.tensor(row["total_loss"])) for row in detectors)
    assert checks["a"]["reference"] == dict(measured=tool.VITDET_B, s_per_iter=detectors[0]["s_per_iter"],
                                            peak_memory_gb=None)
    for row in detectors[1:]:
        assert row["vs_vitdet_b"]["s_per_iter_ratio"] == row["s_per_iter"] / detectors[0]["s_per_iter"]
    assert checks["b"]["optim_wrapper"] == "OptimWrapper" and torch.isfinite(torch.tensor(checks["b"]["loss"]))
    assert checks["c"]["autocast_dtype"] == "bfloat16" and checks["c"]["grad_scaler"] is False

    # (d) spawns the benchmark's memory workers, which see this CPU's own bf16: fp32 here
    assert tool.main([*common, "--checks", "d", "--no-amp", "--output", str(tmp_path / "d.json")]) == 0
    throughput = json.loads((tmp_path / "d.json").read_text())["checks"]["d"]
    assert [row["model"] for row in throughput["rows"]] == ["srvit_s_t3", "deit_small_patch16_224", "timm ViT depth=32"]
    assert all(row["img_per_s"] > 0 and row["peak_tflops"] == "unknown" and row["mfu"] is None
               for row in throughput["rows"])
    assert [round(row["gmacs"], 2) for row in throughput["rows"]] == [12.42, 4.61, 12.19]  # count_flops at 224
    assert {(c["a"], c["b"]) for c in throughput["paired"]} == {
        ("srvit_s_t3 infer", "deit_small_patch16_224 infer"), ("srvit_s_t3 infer", "timm ViT depth=32 infer")}
    assert throughput["reference"]["srvit_s_t3"]["value"] == 943


def test_the_backbone_check_pairs_each_variant_with_both_anchors(tmp_path):
    """(f), small (a T-T2 backbone at 32 px): global and windowed, inference and training step,
    each paired with timm's ViT and detectron2's ViTDet of the same applications."""
    tool = load_tool("gpu_check")
    assert tool.main(["--device", "cpu", "--size", "32", "--steps", "1", "--warmup", "0", "--backbone", "srvit_t_t2",
                      "--checks", "f", "--output", str(tmp_path / "f.json")]) == 0
    backbone = {(c["a"], c["b"]) for c in json.loads((tmp_path / "f.json").read_text())["checks"]["f"]["paired"]}
    for mode in ("infer", "train"):
        for variant in ("global", "win"):
            for anchor in ("timm ViT depth=14", "detectron2 ViTDet depth=14"):
                assert (f"srvit_t_t2[{variant}] {mode}", f"{anchor} {mode}") in backbone


def test_mfu_reads_the_gpus_dense_peak():
    """MFU = 2 x multiply-adds x img/s over the GPU's dense fp16 / bf16 peak (the issue's H200
    figure: 7475 img/s of 12.42 GMACs is 186 TFLOP/s); a GPU not in the table is 'unknown'."""
    tool = load_tool("gpu_check")
    assert tool.peak_tflops("NVIDIA H200") == 989 and tool.peak_tflops("NVIDIA H100 PCIe") == 756
    assert tool.peak_tflops("NVIDIA A100-SXM4-80GB") == 312 and tool.peak_tflops("Some GPU") is None
    row = tool.model_flops_utilisation(7475, 12.42, "NVIDIA H200")
    assert round(row["achieved_tflops"]) == 186 and abs(row["mfu"] - 185.7 / 989) < 1e-3
    assert tool.model_flops_utilisation(7475, 12.42, None)["mfu"] is None


def test_the_device_comparison_restores_tf32_and_runs_here():
    """(e)'s model comparison on the CPU (its bf16 / fp16 autocast against its fp32): every row
    within its bounds, and the caller's TF32 settings as they were."""
    tool = load_tool("gpu_check")
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        rows = tool.model_on_device_against_cpu(torch.device("cpu"))
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert [r["case"].split(", ", 1)[1] for r in rows] == [
        "cpu fp32 against CPU fp32", "cpu float16 autocast against CPU fp32", "cpu bfloat16 autocast against CPU fp32"]
    assert all(r["ok"] for r in rows), rows


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (make gpu-check runs it on a GPU)")
def test_cuda_device_branches_match_the_cpu():
    """(e) on a GPU: the tiny windowed rel-pos model there against the CPU's fp32."""
    rows = load_tool("gpu_check").model_on_device_against_cpu(torch.device("cuda"))
    assert rows and all(r["ok"] for r in rows), rows
