"""torch.compile of the core model, the mixture visualisation, and the benchmark tool
(which is exercised, never timed, here)."""
import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
import torch._dynamo

from srvit_backbones import SRViT, create_srvit
from srvit_backbones.amp import cpu_has_native_bf16
from helpers import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_torch_compile_matches_eager_and_does_not_recompile():
    torch.manual_seed(0)
    model = SRViT(img_size=32, embed_dim=32, num_heads=2, layout=(2, 1), num_steps=3, num_classes=4,
                  zero_init_recursion=False)
    model.set_grad_checkpointing(True)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(compiled(x), model(x))
    compiled(x).sum().backward()  # first training step compiles
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model(x).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, msg=n)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):  # later steps reuse the graph
            compiled(torch.randn(2, 3, 32, 32)).sum().backward()


def test_benchmark_tool_interleaves_models_and_pairs_their_rounds(tmp_path):
    path = tmp_path / "bench.json"
    argv = ["--model", "srvit_t_t2", "--size", "32", "--batch-size", "2", "--warmup", "1", "--repeats", "3",
            "--references", "vit_same_depth", "--modes", "infer", "train", "--grad-checkpointing", "both",
            "--default-malloc", "--json", str(path)]  # leave this test process's allocator alone
    result = load_tool("benchmark").main(argv)
    saved = json.loads(path.read_text())
    assert saved["rows"] == result["rows"] and "srvit_t_t2" in saved["command"]
    assert saved["method"]["malloc"] == "default"
    kinds = [(r["kind"], r["mode"], r["grad_checkpointing"]) for r in saved["rows"]]
    assert kinds == [("srvit", "infer", False), ("vit_same_depth", "infer", False),
                     ("srvit", "train", False), ("srvit", "train", True),
                     ("vit_same_depth", "train", False), ("vit_same_depth", "train", True)]
    vit = saved["rows"][1]
    assert abs(vit["params_m"] - (14 * 1.7745 + 0.3)) < 0.2  # D_eff = 14 blocks of width 384 + embeddings
    for r in saved["rows"]:
        assert len(r["times_s"]) == 3 and r["median_s"] > 0
        assert r["peak_mib"] > r["params_m"] * 4e6 / 2 ** 20  # at least its own fp32 parameters
        assert len(r["minor_page_faults"]) == 3 and min(r["minor_page_faults"]) >= 0

    # every round runs each model of a mode once, in alternating order (A B, B A, A B)
    for mode, n in (("infer", 2), ("train", 4)):
        rows = [r for r in saved["rows"] if r["mode"] == mode]
        for rnd in range(3):
            starts = [r["step_started"][rnd] for r in rows]
            order = sorted(range(n), key=starts.__getitem__)
            assert order == (list(range(n)) if rnd % 2 == 0 else list(range(n))[::-1])
            if rnd:
                assert min(starts) > max(r["step_started"][rnd - 1] for r in rows)

    pairs = {(c["a"], c["b"]): c for c in saved["comparisons"]}
    assert set(pairs) == {("srvit_t_t2 infer", "timm ViT depth=14 infer"),
                          ("srvit_t_t2 train", "timm ViT depth=14 train"),
                          ("srvit_t_t2 train ckpt", "timm ViT depth=14 train ckpt"),
                          ("srvit_t_t2 train ckpt", "srvit_t_t2 train")}
    c = pairs[("srvit_t_t2 infer", "timm ViT depth=14 infer")]
    expected = [a / b for a, b in zip(saved["rows"][0]["times_s"], vit["times_s"])]
    assert c["time_ratios"] == expected and c["min"] <= c["ci95"][0] <= c["median"] <= c["ci95"][1] <= c["max"]
    assert c["best_ratio"] == saved["rows"][0]["min_s"] / vit["min_s"]


def test_benchmark_tool_refuses_bad_arguments():
    bench = load_tool("benchmark")
    for argv, message in ((["--model", "srvit_x"], "unknown --model 'srvit_x'"),
                          (["--size", "100"], "--size 100 is not a positive multiple"),
                          (["--references", "no_such_net"], "'no_such_net' is neither"),
                          (["--device", "cuda"], "CUDA is not available")):
        if "cuda" in argv and torch.cuda.is_available():
            continue
        with pytest.raises(SystemExit) as e:
            bench.main(argv)
        assert message in str(e.value)


ALLOCATE_AND_FREE = """
import sys, torch
sys.path.insert(0, sys.argv[1])
import benchmark
if sys.argv[2] == "keep":
    assert benchmark.keep_freed_memory() is not None
def step():  # like a forward pass: many large buffers, all freed at the end
    buffers = [torch.ones(2 ** 21) for _ in range(24)]  # 24 x 8 MiB
    del buffers
step()
before = benchmark.minor_page_faults()
for _ in range(5):
    step()
print(benchmark.minor_page_faults() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_benchmark_keeps_freed_memory_instead_of_faulting_it_in_every_step():
    def faults(setting):
        out = subprocess.run([sys.executable, "-c", ALLOCATE_AND_FREE, os.path.join(ROOT, "tools"), setting],
                             capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])
    default, kept = faults("default"), faults("keep")
    pages = 5 * 24 * 2 ** 23 // os.sysconf("SC_PAGE_SIZE")  # what the five timed steps touch
    # the default trims the freed buffers back to the kernel in some or all of the steps
    # (seen: one step's worth or all five), the setting at most once
    assert kept < pages // 20 and default > 10 * max(kept, 100), (default, kept, pages)


TINY = "embed_dim=64,num_heads=2"  # core arguments that make any --model tiny


def test_benchmark_variants_build_with_their_arguments_and_compare_with_the_first(tmp_path):
    bench = load_tool("benchmark")
    argv = ["--model", "srvit_t_t2", "--size", "64", "--batch-size", "1", "--warmup", "0", "--repeats", "2",
            "--references", "--modes", "infer", "--default-malloc", "--json", str(tmp_path / "b.json"),
            "--variant", f"global:{TINY}",
            "--variant", f"win:{TINY},window_size=2,use_rel_pos=True,global_attn_indexes=(0, 13)"]
    rows = bench.main(argv)["rows"]
    assert [(r["variant"], r["mode"]) for r in rows] == [("global", "infer"), ("win", "infer")]
    assert rows[1]["model_args"] == dict(embed_dim=64, num_heads=2, window_size=2, use_rel_pos=True,
                                         global_attn_indexes=(0, 13))
    # the timed models are the ones these arguments build: the windowed one carries
    # relative-position tables and no class token, so its parameter count differs
    win = create_srvit("srvit_t_t2", img_size=64, num_classes=0, **rows[1]["model_args"])
    assert win.window_size == 2 and any(win.units[1].window_sizes)
    assert rows[1]["params_m"] == sum(p.numel() for p in win.parameters()) / 1e6 != rows[0]["params_m"]
    (c,) = json.loads((tmp_path / "b.json").read_text())["comparisons"]
    assert (c["a"], c["b"]) == ("srvit_t_t2[win] infer", "srvit_t_t2[global] infer")
    assert c["params_diff_m"] == pytest.approx(rows[1]["params_m"] - rows[0]["params_m"])
    assert c["time_ratios"] == [a / b for a, b in zip(rows[1]["times_s"], rows[0]["times_s"])]


@pytest.mark.parametrize("spec,message", [
    ("win", "expected NAME:key=value"),
    ("win:window_size=", "expected NAME:key=value"),
    ("win:14", "every argument needs a name"),
    ("win:window_size=fourteen", "not a Python literal"),
    ("win:window_sise=14", "'window_sise' is not an SRViT argument"),
    ("win:img_size=512", "img_size is set by the benchmark"),
    ("win:window_size=-1", "srvit_t_t2 refuses {'window_size': -1}: window_size must be an integer >= 0"),
])
def test_benchmark_refuses_bad_variants_with_the_fix(spec, message):
    with pytest.raises(SystemExit) as e:
        load_tool("benchmark").main(["--model", "srvit_t_t2", "--size", "32", "--variant", spec])
    assert message in str(e.value)


def test_benchmark_refuses_repeated_variant_names_and_variants_of_a_detector():
    bench = load_tool("benchmark")
    for argv, message in ((["--variant", "a:", "--variant", "a:window_size=2"], "--variant names must differ"),
                          (["--detector", "mask_rcnn_srvit_s_t3.py", "--variant", "a:"], "--detector-opts")):
        with pytest.raises(SystemExit) as e:
            bench.main(["--model", "srvit_t_t2", "--size", "32"] + argv)
        assert message in str(e.value)


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16")
def test_benchmark_amp_rows_record_their_dtype_and_pair_with_fp32():
    result = load_tool("benchmark").main(["--model", "srvit_t_t2", "--size", "32", "--batch-size", "1", "--warmup", "0",
                                     "--repeats", "2", "--references", "--modes", "train", "--amp", "both",
                                     "--variant", f"tiny:{TINY}", "--default-malloc"])
    assert [(r["amp"], r["amp_dtype"]) for r in result["rows"]] == [(False, None), (True, "bfloat16")]
    assert result["method"]["amp_dtype"] == "bfloat16"
    assert [(c["a"], c["b"]) for c in result["comparisons"]] == [("srvit_t_t2[tiny] train bf16",
                                                                 "srvit_t_t2[tiny] train")]


def test_benchmark_amp_on_a_cpu_without_bf16_says_so(monkeypatch):
    import srvit_backbones.amp
    monkeypatch.setattr(srvit_backbones.amp, "cpu_has_native_bf16", lambda: False)  # a CPU without it
    with pytest.raises(SystemExit) as e:
        load_tool("benchmark").main(["--model", "srvit_t_t2", "--size", "32", "--device", "cpu", "--amp"])
    assert "no native bf16" in str(e.value) and "run without --amp" in str(e.value)


TINY_DETECTOR_OPTS = ["model.backbone.square_pad=64", "model.backbone.net.img_size=64"]


def test_benchmark_detector_mode_times_whole_training_steps_of_configs(tmp_path):
    bench = load_tool("benchmark")
    argv = ["--detector", "quickstart/mask_rcnn_srvit_tiny_cpu.py", "quickstart/mask_rcnn_srvit_tiny_win_cpu.py",
            "--detector-opts", *TINY_DETECTOR_OPTS, "--batch-size", "1", "--warmup", "0", "--repeats", "1",
            "--modes", "train", "--default-malloc"]
    result = bench.main(argv)
    rows = result["rows"]
    assert [(os.path.basename(r["name"]), r["kind"], r["mode"], r["size"]) for r in rows] == [
        ("mask_rcnn_srvit_tiny_cpu.py", "detectron2", "train", 64),
        ("mask_rcnn_srvit_tiny_win_cpu.py", "detectron2", "train", 64)]
    assert all(r["median_s"] > 0 and r["peak_mib"] > 0 for r in rows) and "detectron2" in result["machine"]
    (c,) = result["comparisons"]
    assert (c["a"], c["b"]) == ("mask_rcnn_srvit_tiny_win_cpu train", "mask_rcnn_srvit_tiny_cpu train")
    assert c["params_diff_m"] > 0  # the windowed backbone's relative-position tables

    # one step is forward, backward and the config's optimizer step, on the synthetic batch
    job = dict(kind="detectron2", name="quickstart/mask_rcnn_srvit_tiny_cpu.py", overrides=TINY_DETECTOR_OPTS, mode="train",
               grad_checkpointing=True, amp=False, amp_dtype=None)
    step, model, size = bench.make_detector_step(job, argparse.Namespace(batch_size=2), torch.device("cpu"))
    assert size == 64 and model.backbone.net.srvit.grad_checkpointing
    weight = model.roi_heads.mask_head.predictor.weight
    before = weight.detach().clone()
    step()
    assert not torch.equal(before, weight) and weight.grad is None


def test_benchmark_detector_mode_refuses_unknown_configs():
    with pytest.raises(SystemExit) as e:
        load_tool("benchmark").main(["--detector", "no_such_config.py"])
    assert "'no_such_config.py' not found" in str(e.value)


def test_benchmark_compile_pairs_each_model_with_its_eager_run():
    """``--compile both``: every model twice, compiled and eager; a compiled row is compared
    with its own eager row and with the other compiled models only; a detector is refused."""
    bench = load_tool("benchmark")
    args = bench.parse_args(["--model", "srvit_t_t2", "--compile", "both", "--references", "deit_small_patch16_224"])
    jobs = bench.make_jobs(args, [], None, "infer")
    assert [(j["name"], j["compiled"]) for j in jobs] == [("srvit_t_t2", False), ("srvit_t_t2", True),
                                                          ("deit_small_patch16_224", False),
                                                          ("deit_small_patch16_224", True)]
    rows = [dict(j, times_s=[1.0, 2.0], min_s=1.0, peak_mib=10.0, params_m=1.0) for j in jobs]
    assert sorted((c["a"], c["b"]) for c in bench.comparisons(rows)) == [
        ("srvit_t_t2 infer", "deit_small_patch16_224 infer"),
        ("srvit_t_t2 infer compiled", "deit_small_patch16_224 infer compiled"),
        ("srvit_t_t2 infer compiled", "srvit_t_t2 infer")]
    with pytest.raises(SystemExit, match="--compile times compiled backbones"):
        bench.main(["--detector", "mask_rcnn_srvit_s_t3.py", "--compile"])


def test_vitdet_same_depth_is_detectron2s_vit_with_the_windowed_variants_applications():
    """The windowed reference: detectron2's own ViT, as deep as the variant applies blocks, its
    global blocks where the variant's global applications are, relative positions on; timed and
    paired with every variant."""
    bench = load_tool("benchmark")
    from detectron2.modeling.backbone.vit import ViT

    windowed = create_srvit("srvit_t_t2", img_size=64, window_size=2, use_rel_pos=True, num_classes=0)
    ref = bench.build("vitdet_same_depth", "srvit_t_t2", 64, False, dict(window_size=2, use_rel_pos=True))
    net = ref.net
    assert isinstance(net, ViT) and len(net.blocks) == windowed.effective_depth == 14
    assert [i for i, b in enumerate(net.blocks) if b.window_size == 0] == list(windowed.global_attn_indexes)
    assert all(b.attn.use_rel_pos and b.attn.num_heads == 6 for b in net.blocks) and net.blocks[0].window_size == 2
    assert ref(torch.randn(1, 3, 64, 64)).shape == (1, 384, 4, 4)

    result = bench.main(["--model", "srvit_t_t2", "--size", "64", "--batch-size", "1", "--warmup", "0",
                         "--repeats", "1", "--modes", "train", "--references", "vitdet_same_depth",
                         "--variant", "global:", "--variant", "win:window_size=2,use_rel_pos=True", "--default-malloc"])
    pairs = {(c["a"], c["b"]) for c in result["comparisons"]}
    assert ("srvit_t_t2[win] train", "detectron2 ViTDet depth=14 train") in pairs
    assert ("srvit_t_t2[global] train", "detectron2 ViTDet depth=14 train") in pairs
    with pytest.raises(SystemExit, match="vitdet_same_depth mirrors a windowed model: add a --variant with windows"):
        bench.main(["--model", "srvit_t_t2", "--references", "vitdet_same_depth"])


def test_detectron2s_vitdet_b_reference_config_is_timed_beside_ours():
    """The shipped ViTDet ViT-B reference (detectron2's model zoo model and optimizer) runs in
    the detector mode next to our windowed detector, in one command; as the first config it is
    the baseline ours is paired with (ours / ViTDet-B)."""
    bench = load_tool("benchmark")
    cfg, size = bench.detector_config(dict(name="reference/mask_rcnn_vitdet_b.py", overrides=[], grad_checkpointing=False))
    net = cfg.model.backbone.net
    assert (size, net.embed_dim, net.depth, net.window_size, list(net.window_block_indexes)) == (
        1024, 768, 12, 14, [0, 1, 3, 4, 6, 7, 9, 10])
    narrow = [f"model.{key}=64" for key in (
        "backbone.net.embed_dim", "backbone.out_channels", "proposal_generator.head.in_channels",
        "roi_heads.box_head.input_shape.channels", "roi_heads.box_predictor.input_shape.channels",
        "roi_heads.mask_head.input_shape.channels", "roi_heads.batch_size_per_image")]
    narrow += ["model.backbone.net.num_heads=2", "model.roi_heads.box_head.conv_dims=[64,64]",
               "model.roi_heads.box_head.fc_dims=[64]", "model.roi_heads.mask_head.conv_dims=[64,64]"]
    result = bench.main(["--detector", "reference/mask_rcnn_vitdet_b.py", "quickstart/mask_rcnn_srvit_tiny_win_cpu.py",
                         "--detector-opts", *TINY_DETECTOR_OPTS, *narrow, "--batch-size", "1", "--warmup", "0",
                         "--repeats", "1", "--modes", "train", "--default-malloc"])
    (c,) = result["comparisons"]
    assert (c["a"], c["b"]) == ("mask_rcnn_srvit_tiny_win_cpu train", "mask_rcnn_vitdet_b train")


def test_attention_mode_times_every_kernel_and_checks_it_against_detectron2(tmp_path):
    """``--attention``: each kernel (ours, each of KERNELS, flash, detectron2's formula) on the
    global grid and its windows, in both CPU precisions; ours agree with detectron2's formula,
    the ``blocked`` kernel keeps less for the backward than the materialised bias."""
    result = load_tool("benchmark").main(["--attention", "--size", "64", "--batch-size", "1", "--warmup", "0",
                                          "--repeats", "2", "--device", "cpu", "--json", str(tmp_path / "a.json")])
    rows = json.loads((tmp_path / "a.json").read_text())["rows"]
    assert rows == result["rows"]
    kernels = ["flash, no bias", "detectron2 formula", "ours (default choice)", "ours: blocked", "ours: bias", "ours: flex"]
    assert [(r["case"], r["dtype"], r["kernel"]) for r in rows] == [
        (case, dtype, k) for case in ("global", "windows") for dtype in ("float32", "bfloat16") for k in kernels]
    assert {(r["case"], r["images"], tuple(r["grid"])) for r in rows} == {("global", 1, (4, 4)), ("windows", 1, (14, 14))}
    for r in rows:
        assert len(r["forward_s"]) == 2 and all(t > 0 for t in r["forward_s"])
        if r["kernel"].startswith("ours"):
            assert r["output_cosine"] > (0.99999 if r["dtype"] == "float32" else 0.999), r
        if r["kernel"] == "ours: flex":  # no flex backward on the CPU
            assert r["forward_backward_s"] is None
        elif r["kernel"].startswith("ours"):
            assert min(r["gradient_cosines"]) > (0.99999 if r["dtype"] == "float32" else 0.99), r
    saved = {(r["case"], r["dtype"], r["kernel"]): r["saved_mib"] for r in rows if "saved_mib" in r}
    assert saved["windows", "float32", "ours: blocked"] < saved["windows", "float32", "ours: bias"]
    with pytest.raises(SystemExit, match="--attention times the attention kernels alone.*drop --detector, --variant, --amp"):
        load_tool("benchmark").main(["--attention", "--amp", "--device", "cpu"])
