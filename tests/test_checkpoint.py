"""Checkpoints load completely or fail: containers and framework prefixes are unwrapped,
missing backbone weights raise with a short grouped report, files that are not checkpoints
say so, and tools/convert_checkpoint.py refuses to write an incomplete file."""
import logging

import pytest
import torch

from helpers import load_tool
from srvit_backbones import CheckpointError, create_srvit, load_pretrained
from srvit_backbones.checkpoint import adapt_pos_embed, group_keys, read_checkpoint


def tiny(**kw):
    args = dict(img_size=32, embed_dim=32, num_heads=2, num_classes=0)
    args.update(kw)
    return create_srvit("srvit_s_t2", **args)


def randomized(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def assert_landed(model, sd):
    for name, value in model.state_dict().items():
        assert torch.equal(value, sd[name]), name


@pytest.mark.parametrize("wrap", [
    lambda sd: sd,
    lambda sd: {"model": sd, "epoch": 3},                                              # tools/pretrain.py
    lambda sd: {"state_dict": {f"module.{k}": v for k, v in sd.items()}},              # DDP-wrapped
    lambda sd: {"state_dict": {**{f"backbone.srvit.{k}": v for k, v in sd.items()},    # mmengine segmentor
                               "decode_head.conv_seg.weight": torch.zeros(3, 8, 1, 1),
                               "neck.convs.0.conv.weight": torch.zeros(8, 8, 1, 1)},
                "meta": {"epoch": 1}},
    lambda sd: {"model": {**{f"backbone.net.srvit.{k}": v for k, v in sd.items()},     # detectron2 detector
                          "backbone.simfp_2.0.weight": torch.zeros(8, 8, 2, 2),
                          "roi_heads.box_predictor.cls_score.weight": torch.zeros(81, 8)},
                "iteration": 99},
], ids=["plain", "pretrain", "ddp", "mmengine", "detectron2"])
def test_framework_containers_and_prefixes_load_every_tensor(wrap, caplog):
    src = randomized(tiny())
    sd = src.state_dict()
    model = tiny()
    with caplog.at_level(logging.INFO, logger="srvit_backbones.checkpoint"):
        report = load_pretrained(model, wrap(sd))
    assert_landed(model, sd)
    assert not report.missing and not report.mismatched and len(report.loaded) == len(sd)
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.INFO
    assert len(caplog.records[0].getMessage().splitlines()) <= 6  # a few grouped lines


def test_explicit_prefix_is_honoured_and_a_wrong_one_is_explained():
    src, other = randomized(tiny()), tiny()
    obj = {"state_dict": {**{f"student.{k}": v for k, v in src.state_dict().items()},
                          **{f"teacher.{k}": v for k, v in other.state_dict().items()}}}
    with pytest.raises(CheckpointError, match=r"several ViTs \(under \['student.', 'teacher.'\]\).*prefix="):
        load_pretrained(tiny(), obj)
    model = tiny()
    report = load_pretrained(model, obj, prefix="student.")
    assert_landed(model, src.state_dict())
    assert len(report.outside) == len(other.state_dict())
    with pytest.raises(CheckpointError, match=r"no key of the checkpoint starts with prefix 'backbone.'.*student."):
        load_pretrained(tiny(), obj, prefix="backbone.")


def test_missing_backbone_weights_raise_a_grouped_error_unless_allowed(caplog):
    src = randomized(tiny())
    sd = {k: v for k, v in src.state_dict().items() if not k.startswith(("units.1.blocks.", "units.2.blocks."))}
    with pytest.raises(CheckpointError) as err:
        load_pretrained(tiny(), {"model": sd})
    message = str(err.value)
    assert "does not hold 84 of this model's backbone tensors" in message  # (4 + 3) blocks x 12 tensors
    assert "\n  units.{1,2}.blocks.* (84)\n" in message and "allow_partial=True" in message
    assert len(message.splitlines()) < 12
    model = tiny()
    with caplog.at_level(logging.WARNING, logger="srvit_backbones.checkpoint"):
        report = load_pretrained(model, {"model": sd}, allow_partial=True)
    assert len(report.required_missing) == 84 and caplog.records[-1].levelno == logging.WARNING
    assert "MISSING, left at their initialisation: 84 tensors: units.{1,2}.blocks.* (84)" in caplog.text
    for k, v in sd.items():
        assert torch.equal(model.state_dict()[k], v), k


def test_plain_vit_into_a_recursive_model_names_the_recursion_parameters():
    plain = randomized(tiny(num_steps=1))
    with pytest.raises(CheckpointError, match=r"(?s)units.\{1,2,3,4\}.step_transforms.*Only the recursion parameters"):
        load_pretrained(tiny(), plain.state_dict())
    model = tiny()
    report = load_pretrained(model, plain.state_dict(), allow_partial=True)
    assert {k.split(".")[2] for k in report.required_missing} == {"router", "step_transforms"}
    torch.testing.assert_close(model.units[3].blocks[1].mlp.fc1.weight, plain.units[3].blocks[1].mlp.fc1.weight)


def test_a_new_classifier_and_a_pruned_backbone_are_not_partial_loads():
    classifier = randomized(tiny(num_classes=5))
    sd = classifier.state_dict()
    model = tiny(num_classes=7)  # another class count: the head is dropped and starts anew
    report = load_pretrained(model, sd)
    assert set(report.dropped) == {"head.weight", "head.bias"} and not report.required_missing
    pruned = tiny()
    pruned.prune_intermediate_layers([1, 2, 3, 4], prune_norm=True)
    report = load_pretrained(pruned, sd)
    assert set(group_keys(report.unexpected)) == {"units.5.blocks.* (12)", "norm.* (2)"}
    assert_landed(pruned, sd)


def test_load_time_resize_uses_the_models_interpolation():
    src = randomized(tiny())  # 2x2 grid
    for mode in ("bicubic", "bilinear"):
        model = tiny(img_size=64, pos_embed_interp=mode)
        load_pretrained(model, src.state_dict())
        expected = torch.nn.functional.interpolate(
            src.pos_embed[:, 1:].reshape(1, 2, 2, 32).permute(0, 3, 1, 2), size=(4, 4), mode=mode,
            align_corners=False).permute(0, 2, 3, 1).reshape(1, 16, 32)
        torch.testing.assert_close(model.pos_embed[:, 1:], expected)
        torch.testing.assert_close(model.pos_embed, adapt_pos_embed(src.pos_embed, model))


def test_files_that_are_not_checkpoints_say_so(tmp_path):
    text = tmp_path / "notes.pth"
    text.write_text("these are not weights\n")
    with pytest.raises(CheckpointError, match=r"notes.pth is not a PyTorch checkpoint \(it starts with b'thes'"):
        read_checkpoint(str(text))
    good = tmp_path / "good.pth"
    torch.save(tiny().state_dict(), good)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(CheckpointError, match=r"truncated.pth could not be read as a PyTorch checkpoint.*complete"):
        read_checkpoint(str(truncated))
    with pytest.raises(CheckpointError, match="checkpoint file not found"):
        read_checkpoint(str(tmp_path / "absent.pth"))


def test_safetensors_files_load(tmp_path):
    from safetensors.torch import save_file

    src = randomized(tiny())
    save_file(src.state_dict(), str(tmp_path / "w.safetensors"))
    model = tiny()
    load_pretrained(model, str(tmp_path / "w.safetensors"))
    assert_landed(model, src.state_dict())


def test_convert_checkpoint_refuses_an_incomplete_result(tmp_path):
    tool = load_tool("convert_checkpoint")
    full = randomized(create_srvit("srvit_t_t2", num_classes=0))
    sd = {k: v for k, v in full.state_dict().items() if not k.startswith("units.3.blocks.")}
    torch.save({"state_dict": {f"backbone.srvit.{k}": v for k, v in sd.items()}}, tmp_path / "seg.pth")
    args = [str(tmp_path / "seg.pth"), str(tmp_path / "out.pth"), "--model", "srvit_t_t2"]
    with pytest.raises(SystemExit, match=r"(?s)\n  units.3.blocks.\* \(12\)\n.*nothing was written"):
        tool.main(args)
    assert not (tmp_path / "out.pth").exists()
    report = tool.main(args + ["--allow-missing"])
    assert group_keys(report.required_missing) == ["units.3.blocks.* (12)"]
    written = torch.load(tmp_path / "out.pth", weights_only=True)
    assert written["variant"] == "srvit_t_t2"
    for k, v in sd.items():
        assert torch.equal(written["model"][k], v), k


def test_another_width_is_refused_in_a_few_grouped_lines(tmp_path):
    narrow = create_srvit("srvit_t_t2", embed_dim=32, num_heads=2, num_classes=0)
    with pytest.raises(CheckpointError) as err:
        load_pretrained(create_srvit("srvit_t_t2", num_classes=0), {"model": narrow.state_dict()})
    message = str(err.value)
    assert "width is 32, the model's 384" in message and "units.{0,1,2,3,4}.blocks.* (96)" in message
    assert "e.g. cls_token: checkpoint (1, 1, 32) vs model (1, 1, 384)" in message
    assert len(message.splitlines()) <= 10


def test_an_mmengine_run_checkpoint_is_read_safely_without_importing_the_adapter_first(tmp_path):
    """An mmseg ``iter_N.pth`` holds mmengine's log buffers (HistoryBuffer, numpy arrays), which
    torch's weights_only loading refuses. read_checkpoint allow-lists exactly those types (the
    adapter's loader, imported on demand) so that tools without the adapter read the file; any
    other unknown type is still refused."""
    import subprocess
    import sys

    from mmengine.logging import HistoryBuffer

    core = create_srvit("srvit_t_t2", embed_dim=32, num_heads=2, num_classes=0)
    path = tmp_path / "iter_2.pth"
    buffer = HistoryBuffer()
    buffer.update(1.5)
    torch.save({"state_dict": {f"backbone.srvit.{k}": v for k, v in core.state_dict().items()},
                "message_hub": {"log_scalars": {"train/loss": buffer}}}, path)
    script = ("import sys, torch; from srvit_backbones.checkpoint import read_checkpoint; "
              "assert not {'mmseg', 'mmdet', 'srvit_backbones.mmseg'} & set(sys.modules); "
              f"obj = read_checkpoint({str(path)!r}); "
              "print(sorted(obj), obj['message_hub']['log_scalars']['train/loss'].current())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['message_hub',", "'state_dict']", "1.5"]
    evil = tmp_path / "evil.pth"
    torch.save({"state_dict": {}, "hook": logging.LogRecord("x", 1, "p", 1, "m", None, None)}, evil)
    with pytest.raises(CheckpointError, match="logging.LogRecord.*refuses to unpickle safely"):
        read_checkpoint(str(evil))


def test_a_checkpoint_of_another_layout_is_refused_even_where_the_shapes_fit():
    """SR-ViT-T's (3, 2, 1) checkpoint into a (2, 1) model: every model tensor has a key of the
    same shape, but the checkpoint holds blocks, a router and step transforms inside the model's
    units that the model lacks. That is a mismatch, not a pruned backbone: refused unless
    allow_partial, while extra units after the model's last one (pruning) still load."""
    source = create_srvit("srvit_t_t2", embed_dim=32, num_heads=2, num_classes=0)
    other = create_srvit("srvit_t_t2", embed_dim=32, num_heads=2, num_classes=0, layout=(2, 1))
    with pytest.raises(CheckpointError, match=r"inside this model's units .*\n  units.\{1,2\}.blocks.\* \(24\)"):
        load_pretrained(other, source.state_dict())
    report = load_pretrained(other, source.state_dict(), allow_partial=True)
    assert "units.3.router.weight" in report.unexpected
    pruned = create_srvit("srvit_t_t2", embed_dim=32, num_heads=2, num_classes=0)
    pruned.prune_intermediate_layers([2])
    report = load_pretrained(pruned, source.state_dict())
    assert {k.split(".")[1] for k in report.unexpected if k.startswith("units.")} == {"3", "4"}
