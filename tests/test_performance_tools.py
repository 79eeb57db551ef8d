"""torch.compile of the core model, the measuring harness (``srvit_backbones.analysis.benchmark`` and the
adapters' parts) and the benchmark tool, its entry point (exercised, never timed, here)."""
import importlib
import json
import os
import statistics
import sys

import pytest
import torch
import torch._dynamo

from helpers import load_tool
from srvit_backbones import SRViT, create_srvit
from srvit_backbones.training.amp import cpu_has_native_bf16

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



def test_each_jobs_peak_memory_is_its_own_growth():
    """The peak-memory processes (forked from a server that imported torch once) each report their
    own job's growth of the resident set: a large training job at least its parameters, gradients
    and AdamW's two moments; a tiny model measured after it far less, as measured before it."""
    from srvit_backbones.analysis.benchmark import runner

    args = runner.parse_args(["--model", "srvit_t_t2", "--size", "32", "--batch-size", "1", "--device", "cpu"])
    large = dict(kind="srvit", name="srvit_t_t2", mode="train", grad_checkpointing=False, amp=False, amp_dtype=None)
    tiny = dict(large, mode="infer", variant="tiny", model_args=dict(embed_dim=64, num_heads=2))
    tiny_first, large_peak, tiny_after = (runner.measure_peak_memory(job, args) for job in (tiny, large, tiny))
    assert large_peak["peak_kind"] == "cpu_peak_rss_growth_mib"
    params = create_srvit("srvit_t_t2", img_size=32, num_classes=0).parameters()
    params_mib = sum(p.numel() for p in params) * 4 / 2 ** 20
    assert large_peak["peak_mib"] > 4 * params_mib
    assert tiny_after["peak_mib"] < large_peak["peak_mib"] / 4 and \
        abs(tiny_after["peak_mib"] - tiny_first["peak_mib"]) < params_mib / 4, (tiny_first, large_peak, tiny_after)

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


def in_a_fresh_process(function, *args):
    """``function(*args)`` in a process forked from the benchmark's memory server, which imported
    the runner (and torch) alone and ran nothing: a new interpreter's state without its imports."""
    from srvit_backbones.analysis.benchmark.runner import memory_processes

    with memory_processes().Pool(1) as pool:
        return pool.apply(function, args)


def page_faults_of_five_steps(keep_freed):
    """Minor page faults of five steps that allocate and free 24 buffers of 8 MiB (after one step
    untimed), with ``keep_freed_memory`` or with the C library's defaults."""
    from srvit_backbones.analysis.benchmark import timing

    if keep_freed:
        assert timing.keep_freed_memory() is not None

    def step():  # like a forward pass: many large buffers, all freed at the end
        buffers = [torch.ones(2 ** 21) for _ in range(24)]  # 24 x 8 MiB
        del buffers
    step()
    before = timing.minor_page_faults()
    for _ in range(5):
        step()
    return timing.minor_page_faults() - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_benchmark_keeps_freed_memory_instead_of_faulting_it_in_every_step():
    default, kept = (in_a_fresh_process(page_faults_of_five_steps, keep) for keep in (False, True))
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
    import srvit_backbones.training.amp
    monkeypatch.setattr(srvit_backbones.training.amp, "cpu_has_native_bf16", lambda: False)  # a CPU without it
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


def test_the_detector_step_is_the_configs_model_and_optimizer_on_a_synthetic_batch():
    """One step is forward, backward and the config's optimizer step (the model and optimizer
    tools/train_net.py builds), on images with boxes and polygon masks at the config's input size;
    detectron2's own trainer steps the same config."""
    from detectron2.structures import Instances, PolygonMasks

    from srvit_backbones.detectron2.benchmark import detector_step, synthetic_detection_batch, trainer_steps

    batch = synthetic_detection_batch(2, 48)
    assert [sorted(x) for x in batch] == [["height", "image", "instances", "width"]] * 2
    image, instances = batch[0]["image"], batch[0]["instances"]
    assert image.shape == (3, 48, 48) and image.dtype == torch.uint8 and isinstance(instances, Instances)
    assert isinstance(instances.gt_masks, PolygonMasks) and instances.gt_classes.tolist() == [1, 2, 3, 4]
    assert ((instances.gt_boxes.tensor >= 0) & (instances.gt_boxes.tensor <= 48)).all()
    assert torch.equal(image, synthetic_detection_batch(1, 48)[0]["image"])  # seeded

    step, model, size = detector_step("quickstart/mask_rcnn_srvit_tiny_cpu.py", TINY_DETECTOR_OPTS, mode="train",
                                      batch_size=2, device="cpu", grad_checkpointing=True)
    assert size == 64 and model.backbone.net.srvit.grad_checkpointing
    weight = model.roi_heads.mask_head.predictor.weight
    before = weight.detach().clone()
    step()
    assert not torch.equal(before, weight) and weight.grad is None
    infer, _, _ = detector_step("quickstart/mask_rcnn_srvit_tiny_cpu.py", TINY_DETECTOR_OPTS, mode="infer")
    infer()

    row = trainer_steps("quickstart/mask_rcnn_srvit_tiny_cpu.py", [*TINY_DETECTOR_OPTS, "train.device=cpu"],
                        images=1, warmup=1, steps=1)
    assert row["trainer"] == "SimpleTrainer" and row["grad_scale"] is row["autocast_dtype"] is None
    assert len(row["times_s"]) == 2
    assert row["s_per_iter"] == row["times_s"][1] and torch.isfinite(torch.tensor(row["total_loss"]))


def test_detectron2_configs_load_as_train_net_loads_them():
    from srvit_backbones.detectron2.benchmark import detector_config
    from srvit_backbones.detectron2.training import build_model, build_optimizer, load_config

    cfg = load_config("quickstart/mask_rcnn_srvit_tiny_cpu.py", ["train.device=cpu"])
    model = build_model(cfg)
    optimizer = build_optimizer(cfg, model)
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {
        id(p) for p in model.parameters() if p.requires_grad}
    with pytest.raises(FileNotFoundError, match="'no_such_config.py' not found"):
        load_config("no_such_config.py")
    with pytest.raises(ValueError, match="needs model.backbone.square_pad"):
        detector_config("quickstart/mask_rcnn_srvit_tiny_cpu.py", ["model.backbone.square_pad=0"])


def test_benchmark_detector_mode_refuses_unknown_configs():
    with pytest.raises(SystemExit) as e:
        load_tool("benchmark").main(["--detector", "no_such_config.py"])
    assert "'no_such_config.py' not found" in str(e.value)


def test_benchmark_compile_pairs_each_model_with_its_eager_run():
    """``--compile both``: every model twice, compiled (with its backend) and eager; a compiled
    row is compared with its own eager row and with the other compiled models only; a backend
    without --compile is refused."""
    from srvit_backbones.analysis.benchmark import runner

    args = runner.parse_args(["--model", "srvit_t_t2", "--compile", "both", "--references", "deit_small_patch16_224"])
    jobs = runner.make_jobs(args, [], None, "infer")
    assert [(j["name"], j["compiled"], j.get("compile_backend")) for j in jobs] == [
        ("srvit_t_t2", False, None), ("srvit_t_t2", True, "inductor"),
        ("deit_small_patch16_224", False, None), ("deit_small_patch16_224", True, "inductor")]
    rows = [dict(j, times_s=[1.0, 2.0], min_s=1.0, peak_mib=10.0, params_m=1.0) for j in jobs]
    assert sorted((c["a"], c["b"]) for c in runner.comparisons(rows)) == [
        ("srvit_t_t2 infer", "deit_small_patch16_224 infer"),
        ("srvit_t_t2 infer compiled", "deit_small_patch16_224 infer compiled"),
        ("srvit_t_t2 infer compiled", "srvit_t_t2 infer")]
    with pytest.raises(SystemExit, match="--compile-backend aot_eager chooses --compile's backend: add --compile"):
        load_tool("benchmark").main(["--compile-backend", "aot_eager"])


def test_benchmark_compile_both_times_a_detector_with_its_backbone_compiled_by_the_switch():
    """``--detector --compile both``, a CPU dry run at 64 pixels: the windowed detector eager and
    with its backbone compiled by ``model.backbone.net.compile`` (one graph, no break), paired;
    a detector of another backbone (detectron2's ViT, the reference) has its backbone compiled
    in place."""
    from srvit_backbones.detectron2.benchmark import detector_config, detector_step

    argv = ["--detector", "quickstart/mask_rcnn_srvit_tiny_win_cpu.py", "--detector-opts", *TINY_DETECTOR_OPTS,
            "model.backbone.net.layout=[1]", "--batch-size", "1", "--warmup", "0", "--repeats", "1", "--modes",
            "train", "--compile", "both", "--compile-backend", "eager", "--peak-memory", "off", "--default-malloc"]
    rows = load_tool("benchmark").main(argv)["rows"]
    assert [r["compiled"] for r in rows] == [False, True]
    assert rows[1]["graph_breaks"] == 0 and rows[1]["graphs"] == 1 and rows[1]["median_s"] > 0

    cfg, _ = detector_config("quickstart/mask_rcnn_srvit_tiny_win_cpu.py", compile=dict(backend="eager"))
    assert cfg.model.backbone.net.compile == dict(backend="eager")  # the switch a user sets
    step, model, _ = detector_step("reference/mask_rcnn_vitdet_b.py", ["model.backbone.square_pad=64",
                                   "model.backbone.net.img_size=64", "model.backbone.net.depth=1",
                                   "model.backbone.net.window_block_indexes=[]"], mode="infer",
                                   compile=dict(backend="eager"))
    assert model.backbone.net._compiled_call_impl is not None
    step()


def test_a_compiled_models_graph_breaks_and_graphs_are_recorded():
    """What ``compile_record`` reports of a compiled call (the benchmark's compiled rows; the GPU
    check's (g) fails on a graph break): a function that breaks once makes two graphs."""
    from srvit_backbones.analysis.benchmark.runner import compile_record

    def breaks_once(x):
        x = x.sin()
        print("a graph break")
        return x.cos()

    torch._dynamo.reset()
    with compile_record() as record:
        torch.compile(breaks_once, backend="eager")(torch.randn(3))
    assert (record["graph_breaks"], record["graphs"]) == (1, 2) and "print" in record["graph_break_reasons"][0]
    with compile_record() as record:
        torch.compile(lambda x: x.sin().cos(), backend="eager")(torch.randn(3))
    assert record == dict(graph_breaks=0, graph_break_reasons=[], graphs=1, fx_graph_cache=dict(hits=0, misses=0))


def test_the_timer_synchronises_and_the_paired_ratios_read_rounds():
    from srvit_backbones.analysis.benchmark import Timer, cosine, paired_ratios

    timer = Timer("cpu")
    for _ in range(3):
        with timer.step():
            torch.ones(1000).sum()
    assert len(timer.times) == len(timer.started) == 3 and all(t > 0 for t in timer.times)
    assert timer.started == sorted(timer.started)
    summary = timer.summary(warmup=1)
    assert summary["s_per_iter"] == statistics.median(timer.times[1:])
    assert summary["times_s"] == timer.times and summary["warmup_steps"] == 1 and "peak_memory_gb" not in summary
    assert timer.summary(warmup=5)["s_per_iter"] == statistics.median(timer.times)  # fewer steps than the warm-up

    ratios = paired_ratios([2.0, 4.0, 3.0], [1.0, 2.0, 2.0])
    assert ratios["time_ratios"] == [2.0, 2.0, 1.5] and ratios["median"] == 2.0
    assert (ratios["min"], ratios["max"]) == (1.5, 2.0) and 1.5 <= ratios["ci95"][0] <= ratios["ci95"][1] <= 2.0
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([2.0, 0.0])) == 1.0
    assert abs(cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0]))) < 1e-12


def test_the_synthetic_segmentation_batch_and_image_folder(tmp_path):
    from srvit_backbones.analysis.benchmark.data import synthetic_image_folder
    from srvit_backbones.mmseg.benchmark import synthetic_segmentation_batch

    inputs, samples = synthetic_segmentation_batch(2, 32, classes=5)
    assert [x.shape for x in inputs] == [(3, 32, 32)] * 2 and inputs[0].dtype == torch.uint8
    labels = samples[0].gt_sem_seg.data
    assert labels.shape == (1, 32, 32) and 0 <= labels.min() and labels.max() < 5
    assert samples[1].metainfo["img_shape"] == (32, 32)
    root = synthetic_image_folder(str(tmp_path / "folder"), classes=3, images=2, size=16)
    assert sorted(os.listdir(os.path.join(root, "train"))) == ["class0", "class1", "class2"]
    assert sorted(os.listdir(os.path.join(root, "val", "class1"))) == ["0.jpg", "1.jpg"]


def test_no_tool_loads_another_and_the_harness_imports_no_framework():
    """tools/ are entry points over the package (none loads another tools/ script by path);
    importing the harness, as importing srvit_backbones, imports no framework."""
    for name in os.listdir(os.path.join(ROOT, "tools")):
        if name.endswith(".py"):
            with open(os.path.join(ROOT, "tools", name)) as f:
                assert "spec_from_file_location" not in f.read(), name
    harness = ["srvit_backbones.analysis.benchmark", "srvit_backbones.analysis.benchmark.runner",
               "srvit_backbones.analysis.benchmark.devices",
               "srvit_backbones.analysis.benchmark.data", "srvit_backbones.analysis.benchmark.attention"]
    assert in_a_fresh_process(frameworks_loaded_after_importing, harness) == []


def frameworks_loaded_after_importing(modules):
    """The frameworks' modules (and the detectron2 adapter's) loaded once ``modules`` are imported."""
    for name in modules:
        importlib.import_module(name)
    return sorted(n for n in sys.modules if n.split(".")[0] in ("detectron2", "mmseg", "mmdet", "mmengine", "mmcv")
                  or n.startswith("srvit_backbones.detectron2"))


def test_vitdet_same_depth_is_detectron2s_vit_with_the_windowed_variants_applications():
    """The windowed reference: detectron2's own ViT, as deep as the variant applies blocks, its
    global blocks where the variant's global applications are, relative positions on (timed and
    paired with every variant: tests/test_gpu_check.py's (f))."""
    from detectron2.modeling.backbone.vit import ViT

    from srvit_backbones.analysis.benchmark.backbones import build

    windowed = create_srvit("srvit_t_t2", img_size=64, window_size=2, use_rel_pos=True, num_classes=0)
    ref = build("vitdet_same_depth", "srvit_t_t2", 64, False, dict(window_size=2, use_rel_pos=True))
    net = ref.net
    assert isinstance(net, ViT) and len(net.blocks) == windowed.effective_depth == 14
    assert [i for i, b in enumerate(net.blocks) if b.window_size == 0] == list(windowed.global_attn_indexes)
    assert all(b.attn.use_rel_pos and b.attn.num_heads == 6 for b in net.blocks) and net.blocks[0].window_size == 2
    assert ref(torch.randn(1, 3, 64, 64)).shape == (1, 384, 4, 4)
    with pytest.raises(SystemExit, match="vitdet_same_depth mirrors a windowed model: add a --variant with windows"):
        load_tool("benchmark").main(["--model", "srvit_t_t2", "--references", "vitdet_same_depth"])


def test_detectron2s_vitdet_b_reference_config_is_the_model_zoos():
    """The shipped ViTDet ViT-B reference (detectron2's model zoo model and optimizer), the first
    --detector config in the GPU figures, so the baseline ours is paired with (ours / ViTDet-B;
    stepped beside ours in tests/test_gpu_check.py's (a))."""
    from srvit_backbones.detectron2.benchmark import detector_config

    cfg, size = detector_config("reference/mask_rcnn_vitdet_b.py")
    net = cfg.model.backbone.net
    assert (size, net.embed_dim, net.depth, net.window_size, list(net.window_block_indexes)) == (
        1024, 768, 12, 14, [0, 1, 3, 4, 6, 7, 9, 10])


def test_attention_mode_times_every_kernel_and_checks_it_against_detectron2(tmp_path, monkeypatch):
    """``--attention``: each kernel (ours, each of KERNELS, flash, detectron2's formula) on the
    global grid and its windows, in both CPU precisions, its forward and its training step timed
    apart, each with its launches; ours agree with detectron2's formula, the ``blocked`` kernel
    keeps less for the backward than the materialised bias; a kernel that raises is a row with
    its error, and the others still run."""
    from srvit_backbones.analysis.benchmark import attention

    def broken(*args):
        raise RuntimeError("this kernel does not compile here")

    kernels = attention.attention_kernels()
    monkeypatch.setattr(attention, "attention_kernels", lambda: dict(kernels, broken=broken))
    result = load_tool("benchmark").main(["--attention", "--size", "64", "--batch-size", "1", "--warmup", "0",
                                          "--repeats", "2", "--device", "cpu", "--json", str(tmp_path / "a.json")])
    rows = json.loads((tmp_path / "a.json").read_text())["rows"]
    assert rows == result["rows"]
    names = ["flash, no bias", "detectron2 formula", "ours (default choice)", "ours: blocked", "ours: folded",
             "ours: bias", "ours: flex", "broken"]
    assert [(r["case"], r["dtype"], r["kernel"]) for r in rows] == [
        (case, dtype, k) for case in ("global", "windows") for dtype in ("float32", "bfloat16") for k in names]
    assert ({(r["case"], r["images"], tuple(r["grid"])) for r in rows}
            == {("global", 1, (4, 4)), ("windows", 1, (14, 14))})
    for r in rows:
        if r["kernel"] == "broken":
            assert r["error"] == "RuntimeError: this kernel does not compile here" and r["forward_s"] is None
            continue
        assert len(r["forward_s"]) == 2 and all(t > 0 for t in r["forward_s"])
        if r["kernel"].startswith("ours"):
            assert r["output_cosine"] > (0.99999 if r["dtype"] == "float32" else 0.999), r
        if r["kernel"] == "ours: flex":  # no flex backward on the CPU; no flex under a dispatch mode
            assert r["forward_backward_s"] is None and "backward on CPU" in r["forward_backward_error"]
            assert r["forward_launches"] is None and "flex_attention" in r["launches_error"]
            continue
        assert len(r["forward_backward_s"]) == 2 and r["forward_backward_launches"] > r["forward_launches"] >= 1
        if r["kernel"].startswith("ours"):
            assert min(r["gradient_cosines"]) > (0.99999 if r["dtype"] == "float32" else 0.99), r
    by = {(r["case"], r["dtype"], r["kernel"]): r for r in rows}
    assert by["windows", "float32", "ours: blocked"]["saved_mib"] < by["windows", "float32", "ours: bias"]["saved_mib"]
    for case in ("global", "windows"):  # the CPU's default is blocked: the counter sees the same operations
        default, blocked = by[case, "float32", "ours (default choice)"], by[case, "float32", "ours: blocked"]
        assert (default["forward_launches"], default["forward_backward_launches"]) == \
            (blocked["forward_launches"], blocked["forward_backward_launches"])
    with pytest.raises(SystemExit,
                       match="--attention times the attention kernels alone.*drop --detector, --variant, --amp"):
        load_tool("benchmark").main(["--attention", "--amp", "--device", "cpu"])
