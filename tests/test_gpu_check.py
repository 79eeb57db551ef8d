"""tools/gpu_check.py (``srvit_backbones.analysis.benchmark.gpu_check``): without CUDA it runs the
device-branch check with the GPU's choices forced on the CPU and exits 0; every check's code
runs on the CPU at a small size, the way it runs on a GPU (our own loops in bf16 where they
autocast on a GPU; the frameworks' training, whose AMP needs CUDA, in fp32): one run of all of
them, read by the tests below."""
import json

import pytest
import torch

from helpers import load_tool
from srvit_backbones.analysis.benchmark import devices, gpu_check, model_flops_utilisation, peak_tflops
from srvit_backbones.models import rel_pos


def run_checks(tmp_path_factory, checks):
    """``--device cpu --size 64 --checks CHECKS`` (a T-T2 backbone for (f) and (g), (g) through
    aot_eager, the throughput runs (d) and (g) at 32 px, bf16 where the checks autocast; the
    benchmark's peak-memory processes, tested in test_performance_tools.py, left out), through the
    tool's main as a user runs it: its JSON."""
    from srvit_backbones.training import amp

    tool = load_tool("gpu_check")
    output = tmp_path_factory.mktemp("gpu_check") / "check.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(amp, "cpu_has_native_bf16", lambda: True)  # the bf16 branches on any CPU
        code = tool.main(["--device", "cpu", "--size", "64", "--steps", "1", "--warmup", "0", "--throughput-size", "32",
                          "--throughput-batch", "1", "--backbone", "srvit_t_t2", "--compile-backend", "aot_eager",
                          "--no-peak-memory", "--checks", *checks, "--output", str(output)])
    result = json.loads(output.read_text())
    assert code == 0, {name: check.get("error") for name, check in result["checks"].items()}
    return result


@pytest.fixture(scope="module")
def every_check(tmp_path_factory):
    """(a)-(f) in one run."""
    return run_checks(tmp_path_factory, list("abcdef"))


@pytest.fixture(scope="module")
def compile_check(tmp_path_factory):
    """(g), the compiled runs, in a run of its own."""
    return run_checks(tmp_path_factory, ["g"])


def assert_checks_ran_on_the_cpu(result, checks):
    """The run's checks all ran and passed, and its JSON records the machine and the command."""
    assert list(result["checks"]) == list(checks) and result["ok"]
    assert all(check["ok"] and check["wall_s"] >= 0 for check in result["checks"].values())
    machine = result["machine"]
    assert machine["device"] == "cpu" and machine["gpu"] is None and machine["torch"] == torch.__version__
    assert {"processor", "cpus", "torch_threads", "cuda", "srvit_backbones"} <= set(machine)
    assert result["command"].startswith("tools/gpu_check.py --device cpu --size 64")


def test_every_check_runs_on_the_cpu_and_records_the_machine(every_check):
    assert_checks_ran_on_the_cpu(every_check, "abcdef")  # (g): in the compile check's test


def test_the_detectors_run_through_detectron2s_trainer_beside_vitdet_b(every_check):
    """(a) both detectors through the trainer tools/train_net.py builds (on the CPU detectron2's
    SimpleTrainer: its AMPTrainer needs CUDA), ViTDet-B in the same run as the anchor."""
    check = every_check["checks"]["a"]
    detectors = check["rows"]
    assert [row["config"] for row in detectors] == [gpu_check.VITDET_B, *gpu_check.DETECTORS]
    assert all(row["trainer"] == "SimpleTrainer" and row["autocast_dtype"] is None for row in detectors)
    assert all(row["s_per_iter"] > 0 and len(row["times_s"]) == 1
               and row["size"] == 64 and torch.isfinite(torch.tensor(row["total_loss"])) for row in detectors)
    assert check["reference"] == dict(measured=gpu_check.VITDET_B, s_per_iter=detectors[0]["s_per_iter"],
                                      peak_memory_gb=None)
    assert "vs_vitdet_b" not in detectors[0]
    assert all(row["vs_vitdet_b"]["s_per_iter_ratio"] > 0 for row in detectors[1:])


def test_without_mmseg_the_segmentor_check_is_skipped_with_the_reason_and_the_run_passes(tmp_path, monkeypatch):
    """A GPU machine without mmcv's ops or mmseg: (b) says why it did not run, and the exit code
    is 0 (``import mmseg`` made to fail as it fails there)."""
    import importlib
    import sys

    for name in [n for n in sys.modules if n.split(".")[0] == "mmseg"] or ["mmseg"]:
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("srvit_backbones.mmseg", "srvit_backbones.mmseg.adapter", "srvit_backbones.mmseg.benchmark"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    table = importlib.import_module("srvit_backbones.frameworks")  # the package exports its frameworks()
    monkeypatch.delitem(table._ADAPTERS, "mmseg", raising=False)  # built anew, as a fresh process builds it
    output = tmp_path / "check.json"
    assert load_tool("gpu_check").main(["--device", "cpu", "--checks", "b", "--output", str(output)]) == 0
    check = json.loads(output.read_text())["checks"]["b"]
    assert check["ok"] and check["skipped"].startswith("mmseg does not import (ModuleNotFoundError") and \
        "install mmcv with its ops and mmseg" in check["skipped"]


def test_the_segmentor_and_pretraining_steps(every_check):
    """(b) the mmseg step through the config's OptimWrapper (on the CPU: mmengine's AmpOptimWrapper
    needs a GPU), (c) a pretraining step with --amp: bf16 inside the model, no GradScaler."""
    checks = every_check["checks"]
    assert checks["b"]["optim_wrapper"] == "OptimWrapper" and checks["b"]["autocast_dtype"] is None
    assert checks["b"]["loss_scale"] is None and torch.isfinite(torch.tensor(checks["b"]["loss"]))
    assert (checks["b"]["size"], checks["b"]["images"]) == (64, 2)
    assert checks["c"]["autocast_dtype"] == "bfloat16" and checks["c"]["grad_scaler"] is False


def test_the_throughput_rows_pair_srvit_with_deit_and_its_same_depth_vit_with_mfu(every_check):
    """(d): the benchmark's rows at --throughput-size, paired, each with count_flops' multiply-adds
    at that size and MFU ('unknown' peak without a GPU), next to the paper's figures."""
    from srvit_backbones import create_srvit
    from srvit_backbones.analysis.flops import count_flops

    throughput = every_check["checks"]["d"]
    assert throughput["command"].startswith("python tools/benchmark.py --model srvit_s_t3 --size 32")
    assert [row["model"] for row in throughput["rows"]] == ["srvit_s_t3", "deit_small_patch16_224", "timm ViT depth=32"]
    assert all(row["img_per_s"] > 0 and row["peak_tflops"] == "unknown" and row["mfu"] is None
               and row["amp_dtype"] == "bfloat16" for row in throughput["rows"])
    # at 32 px, N = 5 tokens of D = 384: a block is 12 N D^2 (qkv, projection, MLP) + 2 N^2 D (attention)
    # + two layer norms (fvcore: 5 per element), beside the patch embedding and the final norm (no head)
    N, D = 5, 384
    block = 12 * N * D * D + 2 * N * N * D + 2 * 5 * N * D
    srvit = count_flops(create_srvit("srvit_s_t3", img_size=32, num_classes=0), (torch.randn(1, 3, 32, 32),))
    expected = [srvit] + [depth * block + 4 * 3 * 16 * 16 * D + 5 * N * D for depth in (12, 32)]
    assert [round(row["gmacs"] * 1e9) for row in throughput["rows"]] == expected
    assert {(c["a"], c["b"]) for c in throughput["paired"]} == {
        ("srvit_s_t3 infer bf16", "deit_small_patch16_224 infer bf16"),
        ("srvit_s_t3 infer bf16", "timm ViT depth=32 infer bf16")}
    assert throughput["reference"]["srvit_s_t3"]["value"] == 943


def test_the_branch_check_compares_the_gpus_kernel_choices(every_check):
    rows = every_check["checks"]["e"]["rows"]
    assert {row["case"].rsplit(", ", 1)[1] for row in rows} == {"padded_windows", "windows", "global"}
    assert all(row["ok"] and row["max_abs_diff"] <= 1e-5 for row in rows)


def test_the_backbone_check_pairs_each_variant_with_both_anchors(every_check):
    """(f): global and windowed, inference and training step, each paired with timm's ViT and
    detectron2's ViTDet of the same applications."""
    backbone = every_check["checks"]["f"]
    pairs = {(c["a"], c["b"]) for c in backbone["paired"]}
    for mode in ("infer", "train"):
        for variant in ("global", "win"):
            for anchor in ("timm ViT depth=14", "detectron2 ViTDet depth=14"):
                assert (f"srvit_t_t2[{variant}] {mode}", f"{anchor} {mode}") in pairs
    assert all(row["median_s"] > 0 and row["peak_mib"] is None for row in backbone["rows"])
    assert backbone["command"].endswith("--peak-memory off")


def test_the_compile_check_pairs_compiled_with_eager_and_counts_graph_breaks(compile_check):
    """(g): the benchmark's --compile both at --throughput-size and windowed at --size, inference
    and training step: compiled / eager paired, the compiling step and compile time apart, no
    graph break; the 1.2x target is read on a GPU only."""
    assert_checks_ran_on_the_cpu(compile_check, "g")
    check = compile_check["checks"]["g"]
    rows = check["rows"]
    assert [(r["model"], r["size"], r["batch_size"]) for r in rows] == [
        ("srvit_t_t2 infer bf16", 32, 1), ("srvit_t_t2 train bf16", 32, 1),
        ("srvit_t_t2[win] infer bf16", 64, 2), ("srvit_t_t2[win] train bf16", 64, 2)]
    for r in rows:
        assert r["compiled_model"] == r["model"] + " compiled"  # each compiled run beside its own eager run
        assert r["backend"] == "aot_eager" and r["graph_breaks"] == 0 and r["graph_break_reasons"] == []
        assert r["graphs"] >= 1 and r["first_step_s"] > r["compiled_s"] > 0 and r["eager_s"] > 0
    assert check["target"]["met"] is None and check["target"]["speedup"] == rows[1]["speedup"]
    assert all("--compile both --compile-backend aot_eager" in c for c in check["commands"])
    assert "--variant win:window_size=14,use_rel_pos=True" in check["commands"][1]


def test_without_cuda_it_runs_the_branch_check_and_exits_0(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the default runs every check")
    assert load_tool("gpu_check").main(["--output", str(tmp_path / "check.json")]) == 0
    assert "no CUDA device here; running (e) only" in capsys.readouterr().out
    result = json.loads((tmp_path / "check.json").read_text())
    assert list(result["checks"]) == ["e"] and result["ok"]
    with pytest.raises(SystemExit, match="--device cuda but no GPU is visible"):
        load_tool("gpu_check").main(["--device", "cuda"])


def test_mfu_reads_the_gpus_dense_peak():
    """MFU = 2 x multiply-adds x img/s over the GPU's dense fp16 / bf16 peak (the issue's H200
    figure: 7475 img/s of 12.42 GMACs is 186 TFLOP/s); a GPU not in the table is 'unknown'."""
    assert peak_tflops("NVIDIA H200") == 989 and peak_tflops("NVIDIA H100 PCIe") == 756
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312 and peak_tflops("Some GPU") is None
    row = model_flops_utilisation(7475, 12.42, "NVIDIA H200")
    assert round(row["achieved_tflops"]) == 186 and abs(row["mfu"] - 185.7 / 989) < 1e-3
    assert model_flops_utilisation(7475, 12.42, None) == dict(gmacs=12.42, achieved_tflops=2 * 12.42 * 7.475,
                                                              peak_tflops="unknown", mfu=None)


def test_the_device_comparison_compares_the_gpus_kernel_with_the_cpus_and_restores_tf32():
    """(e)'s model comparison on the CPU: the device side runs the GPU's kernel (``folded``), the
    reference the CPU's (``blocked``), in fp32 and under bf16 / fp16 autocast, every row within
    its bounds; the caller's TF32 settings as they were."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        rows = devices.model_on_device_against_cpu(torch.device("cpu"))
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert [r["case"].split(", ", 1)[1] for r in rows] == [
        "cpu fp32 against CPU fp32", "cpu float16 autocast against CPU fp32", "cpu bfloat16 autocast against CPU fp32"]
    assert all((r["kernel"], r["reference_kernel"]) == ("folded", "blocked") for r in rows)
    assert all(r["ok"] for r in rows), rows


def test_each_kernel_forced_in_fp16_and_bf16_agrees_with_the_cpus_fp32():
    """(e)'s kernel rows, run here on the CPU: each of KERNELS and the ``bias`` kernel in calls of
    one map, in fp16 and bf16, windows and the global grid, output and gradients against the
    CPU's fp32, the tables' gradients reported apart (flex, without a backward on the CPU, by its
    output: its table gradients are checked on a GPU, ``test_cuda_device_branches_match_the_cpu``)."""
    rows = devices.kernels_on_device_against_cpu(torch.device("cpu"))
    names = [name for name, *_ in devices.FORCED_KERNELS]
    assert names == [*rel_pos.KERNELS, "bias in calls of one map"]
    assert [r["case"] for r in rows] == [f"rel-pos kernel {name}, {case}, cpu {dtype} against CPU fp32"
                                         for case in ("windows", "global") for dtype in ("float16", "bfloat16")
                                         for name in names]
    assert all(("min_gradient_cosine" in r) == ("min_table_gradient_cosine" in r) == ("kernel flex" not in r["case"])
               for r in rows)
    assert all(r["ok"] for r in rows), rows


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (make gpu-check runs it on a GPU)")
def test_cuda_device_branches_match_the_cpu():
    """(e) on a GPU: each kernel forced there (flex compiled, with head dims of 16, its tables'
    gradients included) and the tiny windowed rel-pos model, against the CPU's fp32."""
    rows = devices.kernels_on_device_against_cpu(torch.device("cuda")) + \
        devices.model_on_device_against_cpu(torch.device("cuda"))
    assert rows and all(r["ok"] for r in rows), rows
    assert all(r["min_table_gradient_cosine"] >= 0.99 for r in rows if "kernel flex" in r["case"])
