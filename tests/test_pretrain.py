"""tools/pretrain.py on the CPU with a generated ImageFolder: train, evaluate, resume,
distillation, the Table 8 recipe, and its checkpoints flowing into both frameworks."""
import contextlib
import json
import os
import re
import shutil

import numpy as np
import pytest
import timm
import torch
from PIL import Image, ImageOps
from timm.data import auto_augment

from helpers import (
    divergence_report,
    file_size_limit,
    free_port,
    interpolated_pos_embed,
    kill_machine_1_beside_one_machine,
    load_tool,
    torchrun,
)
from srvit_backbones import InputError, create_srvit
from srvit_backbones.pretrain import augment, engine, recipe, trainer
from srvit_backbones.training import amp, faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("inet")
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2)):
        for c, colour in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                a = (rng.integers(0, 60, (40, 40, 3)) + np.array(colour) * 0.7).clip(0, 255).astype(np.uint8)
                Image.fromarray(a).save(d / f"{i}.jpg")
    return str(root)


def tiny_args(data, out, *extra):
    return ["--data", data, "--model", "srvit_t_t2", "--input-size", "32", "--batch-size", "4", "--workers", "0",
            "--max-iters-per-epoch", "2", "--log-interval", "1", "--output", str(out), "--amp", "none", *extra]


def tiny_model():
    return timm.create_model("srvit_t_t2", num_classes=3, img_size=32)


def val_loader_of(argv):
    """The validation loader that tools/pretrain.py builds for ``argv``."""
    args = recipe.parse(argv)
    train_set, val_set, num_classes = engine.build_datasets(args)
    return engine.build_loaders(args, tiny_model(), train_set, val_set, num_classes, distributed=False)[1]


def hand_top1(state_dict, loader):
    """Top-1 accuracy (%) of the weights ``state_dict``, counted image by image from the logits."""
    model = tiny_model().eval()
    model.load_state_dict(state_dict)
    correct = total = 0
    with torch.no_grad():
        for images, targets in loader:
            correct += (model(images).argmax(dim=1) == targets).sum().item()
            total += len(targets)
    return 100.0 * correct / total


def assert_same_tensors(got, expected):
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


def test_train_evaluate_resume(image_folder, tmp_path, caplog):
    tool = load_tool("pretrain")
    argv = tiny_args(image_folder, tmp_path, "--epochs", "1", "--model-ema")
    stats = tool.main(argv)
    ckpt = torch.load(tmp_path / "last.pth", weights_only=True)  # safe to load
    assert ckpt["epoch"] == 0 and ckpt["variant"] == "srvit_t_t2" and "model_ema" in ckpt
    # the reported accuracies are those of the saved weights, counted by hand on the val images
    val_loader = val_loader_of(argv)
    assert stats["images"] == 6 and stats["top1"] == pytest.approx(hand_top1(ckpt["model"], val_loader))
    assert stats["ema"]["top1"] == pytest.approx(hand_top1(ckpt["model_ema"], val_loader))
    assert {"optimizer", "scheduler", "best_top1"} <= set(ckpt)
    caplog.set_level("INFO")
    tool.main(tiny_args(image_folder, tmp_path, "--epochs", "2", "--model-ema", "--resume", "auto"))
    assert "at epoch 1" in caplog.text
    lines = [json.loads(x) for x in open(tmp_path / "log.jsonl")]
    assert [x["epoch"] for x in lines] == [0, 1]
    assert torch.load(tmp_path / "last.pth", weights_only=True)["epoch"] == 1


def test_hard_distillation_with_a_tiny_teacher(image_folder, tmp_path):
    teacher = timm.create_model("resnet10t", num_classes=3)
    torch.save(teacher.state_dict(), tmp_path / "teacher.pth")
    stats = load_tool("pretrain").main(tiny_args(image_folder, tmp_path, "--epochs", "1", "--distill", "--teacher",
                                       "resnet10t", "--teacher-weights", str(tmp_path / "teacher.pth")))
    assert stats["images"] == 6
    ckpt = torch.load(tmp_path / "last.pth", weights_only=True)
    assert "dist_token" in ckpt["model"] and "head_dist.weight" in ckpt["model"]


def test_recipe_defaults_match_table8(capsys):
    tool = load_tool("pretrain")
    for model, warmup in (("srvit_s_t2", 5), ("srvit_s_t3", 10), ("srvit_s_t4", 20)):
        tool.main(["--model", model, "--dry-run"])
        r = json.loads(capsys.readouterr().out)
        assert r["warmup_epochs"] == warmup
    assert ((r["epochs"], r["batch_size"], r["lr"], r["lr_base_batch"], r["weight_decay"])
            == (300, 1024, 1e-3, 1024, 0.05))
    assert (r["sched"], r["auto_augment"], r["aug_repeats"], r["reprob"]) == ("cosine", "rand-m9-mstd0.5-inc1", 3, 0.25)
    assert (r["mixup"], r["cutmix"], r["smoothing"], r["crop_pct"], r["input_size"]) == (0.8, 1.0, 0.1, 0.875, 224)
    assert r["teacher"] == "regnety_160"
    tool.main(["--model", "srvit_s_t3", "--dry-run", "--finetune-384", "x.pth"])
    r = json.loads(capsys.readouterr().out)
    assert (r["epochs"], r["batch_size"], r["lr"], r["crop_pct"], r["input_size"]) == (30, 512, 1e-5, 1.0, 384)


@pytest.mark.parametrize("extra, batch_size, lr, effective_lr", [
    ((), 1024, 1e-3, 1e-3),
    (("--batch-size", "256"), 256, 1e-3, 2.5e-4),
    (("--finetune-384", "x.pth"), 512, 1e-5, 1e-5),  # the paper's 1e-5 at batch 512
    (("--finetune-384", "x.pth", "--batch-size", "256"), 256, 1e-5, 5e-6),
    # explicit values that equal the 224 defaults are the user's, not replaced by the 384 recipe
    (("--finetune-384", "x.pth", "--batch-size", "1024"), 1024, 1e-5, 2e-5),
    (("--finetune-384", "x.pth", "--lr", "1e-3"), 512, 1e-3, 1e-3),
    (("--finetune-384", "x.pth", "--lr-base-batch", "1024"), 512, 1e-5, 5e-6),
])
def test_dry_run_shows_the_effective_lr(capsys, extra, batch_size, lr, effective_lr):
    load_tool("pretrain").main(["--model", "srvit_s_t3", "--dry-run", *extra])
    r = json.loads(capsys.readouterr().out)
    assert (r["batch_size"], r["lr"]) == (batch_size, lr)
    assert r["effective_lr"] == pytest.approx(effective_lr, rel=1e-12)


def test_finetune_384_trains_at_the_effective_lr(image_folder, tmp_path):
    torch.save({"model": tiny_model().state_dict()}, tmp_path / "224.pth")
    args = recipe.parse(tiny_args(image_folder, tmp_path, "--finetune-384", str(tmp_path / "224.pth")))
    run = trainer.build(args, distributed=False)
    # no warmup when fine-tuning: the optimizer starts at the recipe's 1e-5 scaled to the batch of 4
    assert [g["lr"] for g in run.optimizer.param_groups] == pytest.approx([1e-5 * 4 / 512] * 2, rel=1e-12)


def test_guarded_posterize_keeps_pillow_semantics():
    rng = np.random.default_rng(0)
    for shape in ((9, 7, 3), (9, 7)):  # RGB, L
        array = rng.integers(0, 256, shape, dtype=np.uint8)
        image = Image.fromarray(array)
        for bits in range(0, 9):  # old Pillow: keep the top `bits` bits of every value, none for 0
            kept = np.uint8((0xFF << (8 - bits)) & 0xFF)
            np.testing.assert_array_equal(np.asarray(augment.posterize(image, bits)), array & kept)
        for bits in range(1, 9):
            assert augment.posterize(image, bits).tobytes() == ImageOps.posterize(image, bits).tobytes()
        assert not np.asarray(augment.posterize(image, -1)).any()
        with pytest.raises(ValueError, match="bits must be between"):  # what the guard is for
            ImageOps.posterize(image, 0)


def test_default_randaugment_survives_thousands_of_draws(image_folder, tmp_path, monkeypatch):
    """The training transform of tools/pretrain.py's loader, drawn 5000 times on one image: the
    default policy asks for 0 posterize bits a few times per thousand images (magnitude >= 10);
    the loader's transform keeps the guarded posterize, timm's table is left as it was."""
    args = recipe.parse(tiny_args(image_folder, tmp_path))
    assert args.auto_augment == "rand-m9-mstd0.5-inc1"
    train_set, val_set, num_classes = engine.build_datasets(args)
    image = Image.open(os.path.join(image_folder, "train", "class0", "0.jpg")).convert("RGB")

    def draw(times):
        loader = engine.build_loaders(args, tiny_model(), train_set, val_set, num_classes, distributed=False)[0]
        engine.seed_epoch(0, 0)
        for _ in range(times):
            loader.dataset.transform(image)

    draw(5000)
    assert auto_augment.NAME_TO_OP["PosterizeIncreasing"] is auto_augment.posterize  # timm's table as it was
    monkeypatch.setattr(augment, "POSTERIZE_OPS", ())  # no guard: timm's own posterize
    with pytest.raises(ValueError, match="bits must be between"):
        draw(5000)


def test_evaluate_weighs_every_image_once(image_folder, tmp_path):
    loader = val_loader_of(tiny_args(image_folder, tmp_path))  # batch 4: the 6 val images come as 4 + 2
    model = tiny_model()
    with torch.no_grad():  # a model that answers class 2 whatever the image
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([0.0, 0.0, 1.0]))
    stats = engine.evaluate(model, loader, recipe.parse(tiny_args(image_folder, tmp_path)))
    # 2 of the 6 images are of class 2 (a mean over the batches (0, 0, 1, 1) and (2, 2) would say 50)
    assert stats["images"] == 6 and stats["top1"] == pytest.approx(100 * 2 / 6) and stats["top5"] == 100


def test_classes_are_the_datasets_class_to_idx(image_folder, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(image_folder, data)
    (data / "train" / "empty").mkdir()  # folders without images are not classes (timm's reader)
    (data / "train" / "notes").mkdir()
    (data / "train" / "notes" / "readme.txt").write_text("not an image")
    run = trainer.build(recipe.parse(tiny_args(str(data), tmp_path / "out")), distributed=False)
    assert run.num_classes == 3 and run.model.head.out_features == 3
    shutil.rmtree(data / "val" / "class2")
    (data / "val" / "class9").mkdir()
    shutil.copy(data / "val" / "class0" / "0.jpg", data / "val" / "class9")
    with pytest.raises(InputError, match=r"^the classes of .*val differ .*missing in val: \['class2'\], only in val: "
                                         r"\['class9'\]"):
        trainer.build(recipe.parse(tiny_args(str(data), tmp_path / "out")), distributed=False)


#: three tiny epochs of 2 iterations with the default augmentation (RandAugment, random erasing,
#: Mixup/CutMix, drop-path), a loader worker, an lr large enough to move the weights, an EMA
RESUME_ARGS = ("--epochs", "3", "--batch-size", "2", "--workers", "1", "--lr", "1e-3", "--lr-base-batch", "2",
               "--warmup-epochs", "0", "--model-ema", "--model-ema-decay", "0.5")


@pytest.fixture(scope="module")
def interrupted(image_folder, tmp_path_factory):
    """One run of RESUME_ARGS to its end, in ``straight``; ``interrupted`` is its output folder as
    it stood right after its first epoch's checkpoint was written (what a run killed there leaves):
    (argv of the interrupted run, interrupted, straight)."""
    base = tmp_path_factory.mktemp("resume")
    interrupted, straight = base / "interrupted", base / "straight"
    save = engine.save_checkpoint

    def save_and_copy_once(path, *args, **kwargs):
        save(path, *args, **kwargs)
        if not interrupted.exists():
            shutil.copytree(straight, interrupted)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "save_checkpoint", save_and_copy_once)
        load_tool("pretrain").main(tiny_args(image_folder, straight, *RESUME_ARGS))
    return tiny_args(image_folder, interrupted, *RESUME_ARGS), interrupted, straight


def test_resume_restores_the_checkpoint_by_value(interrupted, tmp_path):
    argv, out, _ = interrupted
    ckpt = torch.load(out / "last.pth", weights_only=True)
    assert ckpt["epoch"] == 0 and ckpt["global_iter"] == 2
    run = trainer.build(recipe.parse([*argv, "--resume", "auto"]), distributed=False)
    assert (run.start_epoch, run.state["global_iter"], run.best_top1) == (1, 2, ckpt["best_top1"])
    assert run.scheduler.state_dict() == ckpt["scheduler"]
    assert_same_tensors(run.model.state_dict(), ckpt["model"])
    assert_same_tensors(run.model_ema.module.state_dict(), ckpt["model_ema"])
    name = "units.1.blocks.0.attn.qkv.weight"
    assert not torch.equal(ckpt["model_ema"][name], ckpt["model"][name])  # the EMA is its own, not a copy
    # the cosine lr after 2 of 6 iterations, not the lr a new run starts from
    lrs = [g["lr"] for g in ckpt["optimizer"]["param_groups"]]
    assert [g["lr"] for g in run.optimizer.param_groups] == lrs and max(lrs) < run.args.effective_lr
    # AdamW's moments of one parameter (the optimizer's state is indexed by parameter order)
    params = [p for g in run.optimizer.param_groups for p in g["params"]]
    param = dict(run.model.named_parameters())[name]
    saved = ckpt["optimizer"]["state"][next(i for i, p in enumerate(params) if p is param)]
    for moment in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(run.optimizer.state[param][moment], saved[moment]), moment
    assert saved["exp_avg_sq"].any()

    # a checkpoint without EMA: the EMA starts from the resumed weights, not from a new initialisation
    torch.save({k: v for k, v in ckpt.items() if k != "model_ema"}, tmp_path / "no_ema.pth")
    run = trainer.build(recipe.parse([*argv, "--resume", str(tmp_path / "no_ema.pth"), "--output", str(tmp_path)]),
                        distributed=False)
    assert_same_tensors(run.model_ema.module.state_dict(), ckpt["model"])


def test_resumed_run_ends_where_an_uninterrupted_run_ends(interrupted, image_folder, tmp_path):
    """Bitwise: both runs do the same float operations in the same order in one process on the
    CPU, so any difference (data order, augmentation, Mixup/CutMix, drop-path) shows as one."""
    _, out, straight = interrupted
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    load_tool("pretrain").main(tiny_args(image_folder, resumed, *RESUME_ARGS, "--resume", "auto"))
    got = torch.load(resumed / "last.pth", weights_only=True)
    expected = torch.load(straight / "last.pth", weights_only=True)
    assert got["epoch"] == expected["epoch"] == 2 and got["global_iter"] == expected["global_iter"] == 6
    assert_same_tensors(got["model"], expected["model"])
    assert_same_tensors(got["model_ema"], expected["model_ema"])


def test_bad_input_is_explained(image_folder, tmp_path):
    tool = load_tool("pretrain")
    with pytest.raises(SystemExit, match="does not exist: --data must contain train/ and val/"):
        tool.main(tiny_args(str(tmp_path / "nowhere"), tmp_path))
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "empty" / "val").mkdir()
    with pytest.raises(SystemExit, match="has no class folders"):
        tool.main(tiny_args(str(tmp_path / "empty"), tmp_path))
    with pytest.raises(SystemExit, match="unknown SR-ViT variant 'srvit_z'"):
        tool.main(["--model", "srvit_z", "--dry-run"])
    other = tmp_path / "other.pth"
    torch.save({"model": {}, "variant": "srvit_s_t3", "num_classes": 3}, other)
    with pytest.raises(SystemExit, match="checkpoint of 'srvit_s_t3'.*not of 'srvit_t_t2'"):
        tool.main(tiny_args(image_folder, tmp_path, "--epochs", "1", "--resume", str(other)))


def test_pretraining_checkpoint_flows_into_both_frameworks(interrupted):
    path = str(interrupted[2] / "last.pth")  # tools/pretrain.py's, trained at 32 pixels
    sd = torch.load(path, weights_only=True)["model"]
    # the reference: the core model with the pretrained weights, its table resized to 64x64 input
    core = create_srvit("srvit_t_t2", num_classes=3, img_size=32)
    core.load_state_dict(sd)
    ref = create_srvit("srvit_t_t2", num_classes=0, img_size=64).eval()
    ref_sd = {k: v for k, v in sd.items() if not k.startswith("head")}
    ref_sd["pos_embed"] = interpolated_pos_embed(sd["pos_embed"], (2, 2), (4, 4))  # not the loader's function
    ref.load_state_dict(ref_sd)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        expected = ref.forward_feature_maps(x, indices=[1, 2, 3, 4])  # mmseg's default for SR-ViT-T

    from srvit_backbones.detectron2 import SRViTBackbone, SRViTCheckpointer

    d2 = SRViTBackbone("srvit_t_t2", img_size=64, out_features=["last_feat", "unit1", "unit3"]).eval()
    SRViTCheckpointer(d2).load(path)
    with torch.no_grad():
        got = d2(x)
    for name in ("last_feat", "unit1", "unit3"):
        torch.testing.assert_close(got[name], expected[name])

    from mmseg.registry import MODELS

    import srvit_backbones.mmseg  # noqa: F401

    seg = MODELS.build(dict(type="SRViT", variant="srvit_t_t2", img_size=64, _scope_="mmseg",
                            init_cfg=dict(type="Pretrained", checkpoint=path))).eval()
    seg.init_weights()
    with torch.no_grad():
        outs = seg(x)
    for i, out in zip(seg.out_indices, outs):
        torch.testing.assert_close(out, expected[f"unit{i}"])


def test_convert_checkpoint_keeps_ema_and_resizes(tmp_path):
    tool = load_tool("convert_checkpoint")
    src = create_srvit("srvit_t_t2", num_classes=3)
    ema = create_srvit("srvit_t_t2", num_classes=3)
    torch.save({"model": src.state_dict(), "model_ema": ema.state_dict()}, tmp_path / "in.pth")
    report = tool.main([str(tmp_path / "in.pth"), str(tmp_path / "out.pth"), "--model", "srvit_t_t2", "--ema",
                        "--img-size", "64"])
    assert set(report.dropped) == {"head.weight", "head.bias"} and not report.missing
    out = torch.load(tmp_path / "out.pth", weights_only=True)["model"]
    assert out["pos_embed"].shape == (1, 17, 384) and "head.weight" not in out
    torch.testing.assert_close(out["units.1.blocks.0.attn.qkv.weight"],
                               ema.state_dict()["units.1.blocks.0.attn.qkv.weight"])
    # a checkpoint with Python objects is refused safely, and re-saved with --trust
    import argparse as ap

    torch.save({"model": src.state_dict(), "args": ap.Namespace(lr=1)}, tmp_path / "pickled.pth")
    with pytest.raises(SystemExit, match=r"argparse.Namespace.*refuses to unpickle safely.*--trust"):
        tool.main([str(tmp_path / "pickled.pth"), str(tmp_path / "o2.pth"), "--model", "srvit_t_t2"])
    tool.main([str(tmp_path / "pickled.pth"), str(tmp_path / "o2.pth"), "--model", "srvit_t_t2", "--trust"])


# tools/pretrain.py as torchrun starts it, with timm's RepeatAugSampler observed: the indices
# each rank's sampler hands its loader, per pass, are written to drawn_rank<RANK>.json
SAMPLER_RECORDING_LAUNCHER = """
import json, os, runpy, sys

from timm.data.distributed_sampler import RepeatAugSampler

passes, draw = [], RepeatAugSampler.__iter__


def recorded(self):
    indices = list(draw(self))
    passes.append(dict(epoch=self.epoch, rank=self.rank, replicas=self.num_replicas, repeats=self.num_repeats,
                       dataset=len(self.dataset), indices=indices))
    return iter(indices)


RepeatAugSampler.__iter__ = recorded
tool, out = sys.argv[1], sys.argv[2]
sys.argv = [tool] + sys.argv[3:]
try:
    runpy.run_path(tool, run_name="__main__")
finally:
    with open(os.path.join(out, "drawn_rank%s.json" % os.environ["RANK"]), "w") as f:
        json.dump(passes, f)
"""


# ----------------------------------------------------------------------------- mixed precision, compile, DDP
def test_one_amp_rule_for_every_device(monkeypatch):
    """``--amp``: fp16 (and a GradScaler) on CUDA, bf16 on a CPU with native bf16, a clear error
    where the CPU has none; never a silent fp32 run. A named dtype runs on the CPU, with a warning
    where it is emulated."""
    from srvit_backbones.training import amp

    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)
    expected = {("cuda", "auto"): torch.float16, ("cuda:1", "fp16"): torch.float16, ("cuda", "bf16"): torch.bfloat16,
                ("cpu", "auto"): torch.bfloat16, ("cpu", "bf16"): torch.bfloat16, ("cpu", "none"): None,
                ("cuda", "none"): None}
    assert {key: amp.resolve_precision(*key) for key in expected} == expected
    assert [amp.needs_grad_scaler(d) for d in (torch.float16, torch.bfloat16, None)] == [True, False, False]
    monkeypatch.setattr(amp, "cpu_has_native_fp16", lambda: True)
    assert amp.resolve_precision("cpu", "fp16") == torch.float16
    with pytest.raises(ValueError, match="supports 'cuda' and 'cpu'"):
        amp.resolve_precision("mps", "auto")
    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(amp, "cpu_has_native_fp16", lambda: False)
    with pytest.raises(ValueError, match="no native bf16.*--amp none"):
        amp.resolve_precision("cpu", "auto")
    for named, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):  # named: run, emulated, and said
        with pytest.warns(UserWarning, match=f"{named} on this CPU is emulated, slower than fp32"):
            assert amp.resolve_precision("cpu", named) == dtype


def test_a_pretraining_step_with_amp_on_the_cpu_runs_bf16(image_folder, tmp_path, monkeypatch):
    """``tools/pretrain.py --amp`` on the CPU trains in bf16 (seen inside the model: the qkv
    projection's output; the router stays float32) without a GradScaler; a CPU without native
    bf16 stops before any work with the fix."""
    from srvit_backbones.training import amp

    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: True)  # the rule's branch, whatever this CPU has
    run = trainer.build(recipe.parse(tiny_args(image_folder, tmp_path, "--amp")), distributed=False)
    assert run.args.amp == "auto" and run.loss_scaler is None
    seen = []
    block = run.model.units[1].blocks[0]
    block.attn.qkv.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    before = block.attn.qkv.weight.detach().clone()
    engine.train_one_epoch(0, run.train_model, run.train_loader, run.optimizer, run.criterion, run.scheduler,
                           run.args, loss_scaler=run.loss_scaler, mixup_fn=run.mixup_fn, state=run.state)
    assert seen.count(torch.bfloat16) >= 2 * run.model.units[1].num_steps and torch.float32 not in seen
    assert block.attn.qkv.weight.dtype == torch.float32 and not torch.equal(block.attn.qkv.weight, before)
    assert all(torch.isfinite(p).all() for p in run.model.parameters())

    monkeypatch.setattr(amp, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(SystemExit, match="no native bf16.*--amp none"):
        load_tool("pretrain").main(tiny_args(image_folder, tmp_path, "--amp"))


def test_ddp_is_compiled_after_wrapping(image_folder, tmp_path):
    """``--compile`` in a distributed run compiles the DDP-wrapped model (PyTorch's order, so
    all-reduce overlaps the backward); checkpoints still take the bare model."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        run = trainer.build(recipe.parse(tiny_args(image_folder, tmp_path, "--compile")), distributed=True)
    finally:
        dist.destroy_process_group()
    assert isinstance(run.train_model._orig_mod, torch.nn.parallel.DistributedDataParallel)
    assert engine.unwrap(run.train_model) is run.model and run.train_model._orig_mod.module is run.model


# ----------------------------------------------------------------------------- faults (issue 45)
def test_a_diverged_run_stops_within_the_loss_check_interval(image_folder, tmp_path):
    """A real divergence (lr 1e6) with log lines far apart (--log-interval 1000): the run stops
    at the first check of the loss after it went non-finite, at most LOSS_CHECK_INTERVAL - 1
    steps later, and names the step whose loss was the first non-finite one."""
    run = trainer.build(recipe.parse(tiny_args(image_folder, tmp_path, "--epochs", "1", "--lr", "1e6",
                                               "--warmup-epochs", "0", "--mixup", "0", "--cutmix", "0",
                                               "--batch-size", "2", "--max-iters-per-epoch", "0",
                                               "--log-interval", "1000")), distributed=False)
    losses, criterion = [], run.criterion
    run.criterion = lambda outputs, targets: losses.append(criterion(outputs, targets)) or losses[-1]
    with pytest.raises(FloatingPointError) as error:
        trainer.fit(run)
    first = next(step for step, loss in enumerate(losses, 1) if not torch.isfinite(loss))
    iteration, last = divergence_report(str(error.value))
    assert iteration == first and last is None and "--lr" in str(error.value)
    assert f"the loss became {losses[first - 1].item()} (step {first} of epoch 0)" in str(error.value)
    checked_at = engine.LOSS_CHECK_INTERVAL * -(-first // engine.LOSS_CHECK_INTERVAL)  # the next multiple
    assert run.state["global_iter"] == len(losses) == checked_at < run.iters_per_epoch == 9  # not the epoch's end
    assert first > 1  # a real divergence: the initial weights' loss was finite


def test_an_fp16_grad_scaler_skipping_every_step_stops_the_run(image_folder, tmp_path):
    """``--amp fp16`` on the CPU: the GPU's path, fp16 autocast with timm's NativeScaler (on a CPU
    GradScaler), as the tool builds it, at a scale that overflows fp16's gradients at every halving
    (2**100): each step is skipped, the loss stays finite, and the run stops at the 21st skipped
    step in a row, naming it; the weights never moved."""
    with pytest.warns(UserWarning, match="fp16 on this CPU is emulated") if not amp.cpu_has_native_fp16() \
            else contextlib.nullcontext():
        run = trainer.build(recipe.parse(tiny_args(image_folder, tmp_path, "--batch-size", "1", "--amp", "fp16",
                                                   "--max-iters-per-epoch", "0", "--log-interval", "1000", "--mixup",
                                                   "0", "--cutmix", "0")), distributed=False)
    scaler = run.loss_scaler
    assert scaler._scaler._device == "cpu" and scaler._scaler.is_enabled()
    scaler.load_state_dict({**scaler.state_dict(), "scale": 2.0 ** 100})
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    dtypes = []
    run.model.head.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    with pytest.raises(FloatingPointError) as error:
        for epoch in range(2):  # 18 steps each
            engine.train_one_epoch(epoch, run.train_model, run.train_loader, run.optimizer, run.criterion,
                                   run.scheduler, run.args, loss_scaler=scaler, state=run.state)
    limit = faults.MAX_CONSECUTIVE_SKIPPED_STEPS
    iteration, last = divergence_report(str(error.value))
    assert iteration == len(dtypes) == limit + 1 and set(dtypes) == {torch.float16} and last is None
    assert f"skipped {limit + 1} optimizer steps in a row" in str(error.value)
    assert scaler._scaler.get_scale() == 2.0 ** (100 - limit - 1)
    assert_same_tensors(run.model.state_dict(), before)


def test_a_diverged_run_stops_naming_the_last_checkpoint(image_folder, tmp_path):
    """tools/pretrain.py diverging (lr 1e6) with a checkpoint every 2 steps (an epoch): stopped
    naming the iteration, what to try and the last checkpoint, which holds finite weights
    (non-finite ones are not saved): the tool's one line, the message of faults.Diverged."""
    with pytest.raises(SystemExit) as error:
        load_tool("pretrain").main(tiny_args(image_folder, tmp_path, "--epochs", "3", "--lr", "1e6",
                                             "--warmup-epochs", "0", "--mixup", "0", "--cutmix", "0"))
    iteration, last = divergence_report(str(error.value))
    assert iteration <= 4 and "--lr" in str(error.value)
    if last is not None:
        assert last == str(tmp_path / "last.pth")
        assert all(torch.isfinite(v).all() for v in torch.load(last, weights_only=True)["model"].values())


def test_a_checkpoint_write_cut_short_keeps_the_last_complete_one(interrupted, image_folder, tmp_path):
    """A full disk while last.pth is rewritten (ulimit -f): an error naming the file and the
    cause, the earlier last.pth untouched; --resume auto then ends where the uninterrupted run ends."""
    _, out, straight = interrupted
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    saved = (resumed / "last.pth").read_bytes()
    argv = tiny_args(image_folder, resumed, *RESUME_ARGS, "--resume", "auto")
    with file_size_limit(len(saved) // 2), \
            pytest.raises(SystemExit, match=rf"'{resumed / 'last.pth'}' was not written: File too large"):
        load_tool("pretrain").main(argv)  # the tool's one line, the message of faults.CheckpointWriteError
    assert (resumed / "last.pth").read_bytes() == saved and not list(resumed.glob("*.tmp"))

    load_tool("pretrain").main(argv)
    got, expected = (torch.load(d / "last.pth", weights_only=True) for d in (resumed, straight))
    assert got["global_iter"] == expected["global_iter"] == 6
    assert_same_tensors(got["model"], expected["model"])


def test_a_rank_killed_mid_epoch_ends_the_job_on_every_machine(image_folder, tmp_path):
    """2 machines x 1 process on 127.0.0.1; rank 1's worker SIGKILLed in the middle of epoch 1:
    both machines' torchrun exit non-zero within 120 s, no worker is left, the log names rank 1
    and the signal, and the checkpoint of epoch 0 is as it was written. The same launch is the
    multi-node run: its epoch-0 weights equal, bit for bit, those of 1 machine x 2 processes run
    alongside for that epoch only (the 2 epochs' 8 steps are all warmup, whose lrs do not depend on
    the number of epochs). The 1 x 2 run also records what timm's repeated-augmentation sampler
    (the recipe's 3 repeats) draws: each rank its share, 18 / 2 = 9 indices of the epoch;
    interleaved, the two ranks' draws are 6 images each repeated 3 times in a row, so every
    image's augmented copies are split across both ranks. Its evaluation is reduced over both."""
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
        "PYTHONPATH")])))

    launcher = tmp_path / "recording_launcher.py"
    launcher.write_text(SAMPLER_RECORDING_LAUNCHER)

    def launch(layout, rank, port, log, epochs):
        tool = [os.path.join(ROOT, "tools", "pretrain.py")]  # the 1 x 2 run's through the sampler recording
        tool = [str(launcher), *tool, str(tmp_path)] if layout == "1x2" else tool
        return subprocess.Popen([sys.executable, *torchrun(layout, port, rank), *tool, *tiny_args(
                                     image_folder, tmp_path / layout, "--epochs", str(epochs), "--warmup-epochs", "2",
                                     "--max-iters-per-epoch", "4", "--device", "cpu")], env=env,
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)

    port, logs = free_port(), [tmp_path / f"node{r}.log" for r in (0, 1)]
    agents = [launch("2x1", rank, port, log, epochs=2) for rank, log in enumerate(logs)]
    saved = kill_machine_1_beside_one_machine(  # rank 0 logs epoch 1 once epoch 0's last.pth is written
        agents, launch("1x2", 0, free_port(), tmp_path / "1x2.log", epochs=1), (logs[0], "epoch 1 [1/4]"), None,
        tmp_path / "2x1" / "last.pth")
    node1 = logs[1].read_text()
    assert re.search(r"rank\s*: 1 \(local_rank: 0\)\s+exitcode\s*: -9", node1), node1[-2000:]
    assert (tmp_path / "2x1" / "last.pth").read_bytes() == saved
    two_machines, one_machine = (torch.load(tmp_path / layout / "last.pth", weights_only=True)
                                 for layout in ("2x1", "1x2"))
    assert two_machines["epoch"] == one_machine["epoch"] == 0
    assert_same_tensors(two_machines["model"], one_machine["model"])
    log = (tmp_path / "1x2.log").read_text()
    assert "repeated augmentation" not in log  # no warning that it is off
    passes = [json.loads((tmp_path / f"drawn_rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [len(p) for p in passes] == [1, 1], passes  # one epoch: one pass of each rank's sampler
    (first,), (second,) = passes
    assert [(p["epoch"], p["rank"], p["replicas"], p["repeats"], p["dataset"]) for p in (first, second)] == \
        [(0, 0, 2, 3, 18), (0, 1, 2, 3, 18)]
    assert len(first["indices"]) == len(second["indices"]) == 18 // 2
    interleaved = [i for pair in zip(first["indices"], second["indices"]) for i in pair]
    images = interleaved[::3]
    assert len(set(images)) == 6 and interleaved == [i for i in images for _ in range(3)], interleaved
    assert set(images) <= set(first["indices"]) & set(second["indices"])
    assert "top-1" in log and "(6 images)" in log  # evaluation reduced over both processes

