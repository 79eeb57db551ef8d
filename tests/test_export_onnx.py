"""tools/export_onnx.py: the dense backbone as ONNX with dynamic size, loaded from framework
checkpoints, checked with ONNX Runtime against PyTorch by value."""
import os
import re
import subprocess
import sys

import onnxruntime  # the deploy extra; make setup installs it
import onnxscript  # noqa: F401  (the dynamo exporter needs it)
import pytest
import torch

from helpers import load_tool, randomize_routers
from srvit_backbones import CheckpointError, ConfigError, create_srvit
from srvit_backbones.analysis.export import ExportError, build_backbone, check_onnx, main, output_names
from srvit_backbones.training.amp import cpu_has_native_bf16

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(embed_dim=32, num_heads=2)


def trained_tiny(img_size=64, seed=0):
    """A tiny SR-ViT-T T=2 with random (non-uniform) routers, standing in for trained weights."""
    torch.manual_seed(seed)
    return randomize_routers(create_srvit("srvit_t_t2", img_size=img_size, num_classes=0, **TINY)).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The real CLI, run once: an mmseg ``iter_N.pth`` of the tiny model -> ONNX, with --amp
    where the CPU has native bf16 (it only adds lines to the check)."""
    tmp = tmp_path_factory.mktemp("onnx")
    model = trained_tiny()
    checkpoint = tmp / "iter_10.pth"
    state = {f"backbone.srvit.{k}": v for k, v in model.state_dict().items()}
    state["decode_head.conv_seg.weight"] = torch.zeros(2, 8, 1, 1)
    torch.save({"meta": {"iter": 10}, "state_dict": state}, checkpoint)
    output = tmp / "backbone.onnx"
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "export_onnx.py"), "--model", "srvit_t_t2",
         "--checkpoint", str(checkpoint), "--output", str(output), "--set", "embed_dim=32", "num_heads=2",
         "--check-sizes", "64x64", "48x80", *(["--amp"] if cpu_has_native_bf16() else [])],
        capture_output=True, text=True, cwd=str(tmp), env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    return model, output, result.stdout


def test_cli_checks_its_export_at_two_sizes(exported):
    _, output, stdout = exported
    assert "took the backbone under 'backbone.srvit.'" in stdout
    assert "position table 4x4" in stdout  # kept at the checkpoint's size
    diffs = re.findall(r"check (\d+x\d+) \(batch \d\): max abs difference ONNX Runtime vs PyTorch (\S+) \(within",
                       stdout)
    assert [size for size, _ in diffs] == ["64x64", "48x80"], stdout
    assert all(float(d) < 1e-4 for _, d in diffs)
    assert os.path.getsize(output) > 100_000  # the weights are inside the file


def test_onnx_equals_the_checkpoints_model_at_new_sizes(exported):
    """Sizes the export and its check never saw (batch 3 included) give the trained model's
    unit maps, in ``feature_info`` order: the checkpoint's weights, not random ones."""
    model, output, _ = exported
    session = onnxruntime.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    shape = session.get_inputs()[0].shape
    assert shape[1] == 3 and all(isinstance(d, str) for d in (shape[0], shape[2], shape[3]))  # dynamic
    assert [o.name for o in session.get_outputs()] == ["unit1", "unit2", "unit3"]
    for batch, size in [(3, (32, 96)), (1, (112, 64))]:
        x = torch.randn(batch, 3, *size)
        with torch.no_grad():
            expected = model.forward_feature_maps(x)
        got = session.run(None, {"images": x.numpy()})
        for name, out in zip(["unit1", "unit2", "unit3"], got):
            assert out.shape == (batch, 32, size[0] // 16, size[1] // 16)
            torch.testing.assert_close(torch.from_numpy(out), expected[name], atol=1e-4, rtol=1e-3)


def test_check_fails_for_another_model(exported):
    """The check compares by value: the file against a backbone with other weights is refused."""
    _, output, _ = exported
    other, _ = build_backbone("srvit_t_t2", img_size=64, overrides=TINY)  # random weights
    rows = check_onnx(str(output), other, [(64, 64), (48, 80)])
    assert [r["ok"] for r in rows] == [False, False] and all(r["max_abs_diff"] > 1e-2 for r in rows)
    same, _ = build_backbone("srvit_t_t2", {"model": exported[0].state_dict()}, overrides=TINY)
    assert all(r["ok"] for r in check_onnx(str(output), same, [(64, 64), (48, 80)]))


def test_detectron2_checkpoint_keeps_its_position_table():
    """A detectron2 ``model_final.pth`` layout: the backbone under ``backbone.net.srvit.``, a
    6x6 table (96 px); the exported backbone is built at that size and holds those weights."""
    model = trained_tiny(img_size=96)
    checkpoint = {"model": {f"backbone.net.srvit.{k}": v for k, v in model.state_dict().items()}, "iteration": 9}
    backbone, report = build_backbone("srvit_t_t2", checkpoint, overrides=TINY)
    assert backbone.model.pretrain_grid == (6, 6) and "backbone.net.srvit." in report.summary()
    assert output_names(backbone) == ["unit1", "unit2", "unit3"]
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        maps = model.forward_feature_maps(x)
        for name, out in zip(output_names(backbone), backbone(x)):
            assert torch.equal(out, maps[name])


@pytest.mark.parametrize("argv,message", [
    ([], "--checkpoint is required.*--random-weights"),
    (["--checkpoint", "ck.pth", "--random-weights"], "exclude each other"),
    (["--random-weights", "--check-sizes", "64x64"], "expected 2 arguments"),
    (["--random-weights", "--check-sizes", "64x64", "64by64"], "HEIGHTxWIDTH"),
    (["--random-weights", "--set", "num_steps"], "KEY=VALUE"),
])
def test_bad_arguments_are_clear_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "srvit_t_t2", "--output", "x.onnx", *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize("argv,error,message", [
    (["--random-weights", "--check-sizes", "64x64", "40x48"], ExportError,
     r"^check sizes \['40x48'\] are not multiples of"),
    (["--random-weights", "--set", "img_size=64"], ExportError, r"^\['img_size'\] cannot be overridden.*--img-size"),
    (["--random-weights", "--set", "window_size=2"], ExportError,
     "^dynamic-size ONNX export .*window_size=0, use_rel_pos=False.*one input size"),
    (["--random-weights", "--set", "use_rel_pos=True"], ExportError,
     "^dynamic-size ONNX export .*window_size=0, use_rel_pos=False.*one input size"),
    (["--checkpoint", "missing.pth"], CheckpointError, "^checkpoint file not found: missing.pth"),
])
def test_unexportable_requests_fail_before_exporting(argv, error, message, tmp_path):
    output = tmp_path / "x.onnx"
    with pytest.raises(error, match=message):
        main(["--model", "srvit_t_t2", "--output", str(output), *argv])
    assert not output.exists()


def test_the_tool_ends_with_the_error_as_one_line(tmp_path):
    """tools/export_onnx.py: the library's error as its exit message (status 1), "error: " before it."""
    with pytest.raises(SystemExit, match=r"^error: checkpoint file not found: missing.pth$"):
        load_tool("export_onnx").main(["--model", "srvit_t_t2", "--output", str(tmp_path / "x.onnx"),
                                       "--checkpoint", "missing.pth"])


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
def test_amp_reports_what_bf16_costs_and_exports_fp32(exported):
    """The fixture's run had --amp (this CPU has bf16): the graph is still fp32, and the check
    printed the bf16 model's difference, far above fp32's and small."""
    import onnx

    _, output, stdout = exported
    assert "--amp: the exported graph stays fp32" in stdout
    fp32 = re.findall(r"vs PyTorch (\S+) \(within", stdout)
    bf16 = re.findall(r"check (\d+x\d+) \(batch \d\): max abs difference PyTorch bf16 autocast vs ONNX Runtime "
                      r"fp32 (\S+) \((\S+)% of max\|output\|", stdout)
    assert [size for size, _, _ in bf16] == ["64x64", "48x80"], stdout
    for fp32_diff, (_, diff, percent) in zip(fp32, bf16):
        assert float(diff) > 10 * float(fp32_diff)  # bf16 really ran: far coarser than fp32
        assert 0 < float(percent) < 5  # and stays close
    graph = onnx.load(str(output)).graph
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
    assert {t.data_type for t in graph.initializer if t.data_type in floats} == {onnx.TensorProto.FLOAT}
    assert {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]} == {onnx.TensorProto.FLOAT}


def test_amp_without_native_bf16_is_refused_before_exporting(monkeypatch, tmp_path):
    """A CPU without native bf16 (simulated: this one may have it) gets the reason and no file."""
    import srvit_backbones.training.amp

    monkeypatch.setattr(srvit_backbones.training.amp, "cpu_has_native_bf16", lambda: False)
    output = tmp_path / "x.onnx"
    with pytest.raises(ConfigError, match="^--amp on the CPU runs bf16, but this CPU has no native bf16.*run without "
                                          "--amp"):
        main(["--model", "srvit_t_t2", "--random-weights", "--output", str(output), "--amp"])
    assert not output.exists()
