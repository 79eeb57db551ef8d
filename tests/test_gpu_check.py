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
    assert [row["config"] for row in detectors] == list(tool.DETECTORS)
    assert all(row["trainer"] == "SimpleTrainer" and row["s_per_iter"] > 0 and len(row["times_s"]) == 2
               and torch.isfinite(torch.tensor(row["total_loss"])) for row in detectors)
    assert checks["a"]["reference"]["s_per_iter"] == 0.314
    assert checks["b"]["optim_wrapper"] == "OptimWrapper" and torch.isfinite(torch.tensor(checks["b"]["loss"]))
    assert checks["c"]["autocast_dtype"] == "bfloat16" and checks["c"]["grad_scaler"] is False

    # (d) spawns the benchmark's memory workers, which see this CPU's own bf16: fp32 here
    assert tool.main([*common, "--checks", "d", "--no-amp", "--output", str(tmp_path / "d.json")]) == 0
    throughput = json.loads((tmp_path / "d.json").read_text())["checks"]["d"]
    assert [row["model"] for row in throughput["rows"]] == ["srvit_s_t3", "deit_small_patch16_224"]
    assert all(row["img_per_s"] > 0 for row in throughput["rows"])
    assert throughput["reference"]["srvit_s_t3"]["value"] == 943
