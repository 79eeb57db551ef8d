"""Helpers shared by the test files (importable because pytest puts tests/ on sys.path)."""
import contextlib
import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import torch
from filelock import FileLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D2_QUICKSTART = os.path.join(ROOT, "detectron2_configs", "quickstart", "mask_rcnn_srvit_tiny_cpu.py")
SEG_QUICKSTART = os.path.join(ROOT, "mmseg_configs", "quickstart", "upernet_srvit_tiny_cpu.py")

# the detectron2 quickstart at 128 pixels (its own images are 192), 8 iterations
D2_TRAIN = ["model.backbone.net.img_size=128", "model.backbone.square_pad=128",
            "dataloader.train.mapper.augmentations.1.target_height=128",
            "dataloader.train.mapper.augmentations.1.target_width=128",
            "dataloader.train.mapper.augmentations.2.crop_size=[128,128]",
            "dataloader.test.mapper.augmentations.0.short_edge_length=128",
            "dataloader.test.mapper.augmentations.0.max_size=128", "dataloader.train.total_batch_size=2",
            "dataloader.train.num_workers=0", "dataloader.test.num_workers=0",
            "train.max_iter=8", "train.eval_period=8", "train.log_period=2", "train.checkpointer.period=1000"]
TEST_SIZE = [o for o in D2_TRAIN if o.startswith(("model.", "dataloader.test."))]  # the demo's --opts for it
SEG_TRAIN = ["train_cfg.max_iters=4", "train_cfg.val_interval=4", "default_hooks.logger.interval=1",
             "default_hooks.checkpoint.interval=4", "train_dataloader.batch_size=2",
             "param_scheduler.0.end=2", "param_scheduler.1.begin=2", "param_scheduler.1.end=8", "randomness.seed=0"]


def run(cwd, *cmd, **env):
    proc = subprocess.run([sys.executable, *cmd], cwd=str(cwd), env=dict(os.environ, OMP_NUM_THREADS="1", **env),
                          capture_output=True, text=True, timeout=600)
    return proc, proc.stdout + proc.stderr


@contextlib.contextmanager
def session_folder(tmp_path_factory, name):
    """A folder kept for the whole test session, locked while the caller fills it: under
    pytest-xdist every worker has its own base temp folder, so the folder is made beside them
    (in the session's temp folder) and the first worker to ask builds what the others reuse."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    with FileLock(str(base / f"{name}.lock")):
        yield base / name


def free_port() -> int:
    """A TCP port free on the loopback address now (other test processes may be launching too)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(layout: str, port: int, node_rank: int = 0):
    """The torchrun arguments of ``layout``, as the docs give them: '2x1' is 2 machines x 1
    process on 127.0.0.1 (this one ``node_rank``), '1x2' is 1 machine x 2 processes."""
    if layout == "2x1":
        return ["-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(port)]
    return ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
            str(port)]


def child_pids(pid: int):
    """The processes ``pid`` started (torchrun's agent: its workers), from /proc."""
    import glob as globbing

    return [int(child) for path in globbing.glob(f"/proc/{pid}/task/*/children") for child in open(path).read().split()]


def descendants(pid: int):
    """Every process below ``pid``: its children, theirs, ... (torchrun's workers run in sessions of
    their own, so a kill of the agent's process group misses them)."""
    return [p for child in child_pids(pid) for p in (child, *descendants(child))]


def kill_launch(process) -> None:
    """SIGKILL ``process`` (a Popen started in a session of its own), its group and every process
    below it, and reap it."""
    import signal

    below = descendants(process.pid)
    os.killpg(process.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=60)


def is_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for_text(path, text: str, process, timeout: float = 300, poll: float = 0.05) -> None:
    """Until the file ``path`` contains ``text`` (a log line the run of ``process``, a Popen, reached;
    "": until it exists)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(path) and (not text or text in open(path, errors="replace").read()):
            return
        time.sleep(poll)
    raise TimeoutError(f"{text!r} never appeared in {path} (exit code {process.poll()})")


def kill_machine_1_beside_one_machine(machines, one_machine, ready_2x1, ready_1x2, checkpoint, workers=None):
    """A rank killed, and the 1 machine x 2 processes run that the 2 machines x 1 run (``machines``,
    Popens) is compared with, side by side: once the file ``ready_2x1[0]`` holds ``ready_2x1[1]``
    (machine 0 wrote it), ``checkpoint`` is read and machine 1's worker SIGKILLed; once
    ``ready_1x2`` is there, ``one_machine`` is stopped (``kill_launch``: each process was started
    in a session of its own), or, where it is None, ``one_machine`` runs to its end and exits
    0. Both machines must exit non-zero within 120 s and leave no worker. ``workers(pid)``: a
    machine's workers (default: its children). Returns the bytes of ``checkpoint`` before the kill."""
    import signal
    import time

    workers = workers or child_pids

    def kill_rank_1():
        wait_for_text(*ready_2x1, machines[0])
        saved = open(checkpoint, "rb").read()
        started = [pid for machine in machines for pid in workers(machine.pid)]
        (victim,) = workers(machines[1].pid)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        codes = [machine.wait(timeout=120) for machine in machines]
        return saved, started, codes, time.monotonic() - killed

    def stop_one_machine():
        if ready_1x2 is None:
            assert one_machine.wait(timeout=300) == 0
            return
        wait_for_text(*ready_1x2, one_machine)
        kill_launch(one_machine)

    try:
        (saved, started, codes, seconds), _ = side_by_side(kill_rank_1, stop_one_machine)
    finally:
        for process in (*machines, one_machine):
            if process.poll() is None:
                kill_launch(process)
    assert all(code != 0 for code in codes) and seconds < 120, (codes, seconds)
    assert len(started) == 2 and not any(is_running(pid) for pid in started), started
    return saved


def side_by_side(*jobs):
    """The results of ``jobs`` (functions of no arguments, each running a subprocess), run at the
    same time, one thread each: independent runs overlap their imports and waits instead of
    queueing."""
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(job) for job in jobs]
        return [future.result() for future in futures]


def trained_detectron2(tmp_path_factory):
    """tools/train_net.py on 8 synthetic COCO images for 8 iterations: the run's folder (out/:
    model_final.pth, config.yaml, metrics.json; data/coco/val2017: 3 images). Kept for the
    session, so that every test file (and every xdist worker) reuses it."""
    with session_folder(tmp_path_factory, "quickstart_detectron2") as root:
        out = root / "out"
        if not (out / "model_final.pth").exists():
            root.mkdir(exist_ok=True)
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_synthetic_coco.py"), "--root",
                            str(root / "data"), "--train", "8", "--val", "3", "--size", "128", "160"], check=True)
            proc, log = run(root, os.path.join(ROOT, "tools", "train_net.py"), "--config", D2_QUICKSTART,
                            f"train.output_dir={out}", *D2_TRAIN, DETECTRON2_DATASETS=str(root / "data"))
            assert proc.returncode == 0, log[-3000:]
    return root


def trained_mmseg(tmp_path_factory):
    """tools/train_seg.py on 4 synthetic ADE20K images for 4 iterations: the run's folder
    (work/: iter_4.pth, the run's config, TIMESTAMP/vis_data/scalars.json; 2 validation images),
    shared as trained_detectron2's."""
    with session_folder(tmp_path_factory, "quickstart_mmseg") as root:
        work = root / "work"
        if not (work / "iter_4.pth").exists():
            root.mkdir(exist_ok=True)
            subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_synthetic_ade20k.py"), "--root",
                            str(root / "datasets"), "--train", "4", "--val", "2", "--size", "96", "128"], check=True)
            proc, log = run(root, os.path.join(ROOT, "tools", "train_seg.py"), SEG_QUICKSTART, "--work-dir", str(work),
                            "--cfg-options", *SEG_TRAIN)
            assert proc.returncode == 0, log[-3000:]
    return root


def scheduled_lrs(work_dir, steps):
    """{step: lr} the config an mmengine run saved in ``work_dir`` asks for: its
    ``optim_wrapper.optimizer.lr`` under its ``param_scheduler``, stepped by mmengine's own
    schedulers on a lone parameter (layer decay aside), as logged at each of ``steps`` (the lr of
    the iteration that ends at that step)."""
    import glob

    from mmengine.config import Config
    from mmengine.registry import PARAM_SCHEDULERS

    (path,) = glob.glob(os.path.join(str(work_dir), "*.py"))
    cfg = Config.fromfile(path)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim_wrapper.optimizer.lr)
    schedulers = [PARAM_SCHEDULERS.build(dict(s, optimizer=optimizer)) for s in cfg.param_scheduler]
    lrs = {}
    for step in range(1, max(steps) + 1):
        lrs[step] = optimizer.param_groups[0]["lr"]
        for scheduler in schedulers:
            scheduler.step()
    return {step: lrs[step] for step in steps}


def lr_and_decay(model, optim_wrapper):
    """{parameter name: (lr, weight decay)} of the optimizer that mmengine's ``build_optim_wrapper``
    (what the Runner calls) builds for ``model`` from the config's ``optim_wrapper``."""
    import copy

    from mmengine.optim import build_optim_wrapper

    wrapper = build_optim_wrapper(model, copy.deepcopy(optim_wrapper))
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: (g["lr"], g["weight_decay"]) for g in wrapper.optimizer.param_groups for p in g["params"]}


def assert_layer_decay_constructor_honours_paramwise_cfg(model, optim_wrapper):
    """SRViTLayerDecayOptimizerConstructor as an mmengine user configures it (``optim_wrapper``: a
    shipped config's, with lr and weight decay): mmengine's rules give each parameter its lr and
    decay multipliers, the layer-decay factor multiplies the lr; no paramwise_cfg still means
    layer decay and the no-decay set; mmdet ViTDet's names are aliases; unknown or contradictory
    keys are errors naming the key."""
    import pytest
    from mmengine.optim import DefaultOptimWrapperConstructor
    from mmengine.utils.dl_utils.parrots_wrapper import _BatchNorm

    from srvit_backbones.layer_decay import lr_decay_factor

    def built(**paramwise_cfg):
        return lr_and_decay(model, dict(optim_wrapper, paramwise_cfg=paramwise_cfg))

    lr, wd = optim_wrapper["optimizer"]["lr"], optim_wrapper["optimizer"]["weight_decay"]
    sizes = model.backbone.layer_decay_unit_sizes
    plain = built(layer_decay_rate=0.7)
    for name, (got_lr, _) in plain.items():
        assert got_lr == pytest.approx(lr * lr_decay_factor(name, 0.7, sizes, "backbone.srvit.")), name

    # a custom_keys entry changes exactly the parameters it names, by mmengine's rule: lr_mult
    # (times the layer factor) and decay_mult in place of the other decay rules
    custom = built(layer_decay_rate=0.7, custom_keys={".router.": dict(lr_mult=0.1, decay_mult=0.5)})
    routers = [n for n in plain if ".router." in n]
    assert routers and [n for n in plain if custom[n] != plain[n]] == routers
    for name in routers:
        assert custom[name] == pytest.approx((plain[name][0] * 0.1, wd * 0.5)), name
    # another of mmengine's rules: bias_lr_mult, biases outside norm layers
    norm_types = (_BatchNorm, torch.nn.GroupNorm, torch.nn.LayerNorm, torch.nn.modules.instancenorm._InstanceNorm)
    biases = [n for n in plain if n.endswith(".bias")
              and not isinstance(model.get_submodule(n.rsplit(".", 1)[0]), norm_types)]
    doubled = built(layer_decay_rate=0.7, bias_lr_mult=2.0)
    assert biases and [n for n in plain if doubled[n] != plain[n]] == biases
    assert all(doubled[n] == pytest.approx((2 * plain[n][0], plain[n][1])) for n in biases)

    # without paramwise_cfg (mmengine then skips add_params): the same layer decay and no-decay set
    assert lr_and_decay(model, {k: v for k, v in optim_wrapper.items() if k != "paramwise_cfg"}) == plain
    assert plain["backbone.srvit.pos_embed"][1] == 0.0
    assert plain["backbone.srvit.units.1.blocks.0.attn.qkv.weight"][1] == wd > 0
    # mmdet ViTDet's names for the same thing
    assert built(decay_rate=0.7, decay_type="layer_wise", num_layers=sum(sizes)) == plain
    # and mmengine's own constructor, for the parameters layer decay leaves at factor 1
    mmengine = DefaultOptimWrapperConstructor({k: v for k, v in optim_wrapper.items()
                                               if k not in ("constructor", "paramwise_cfg")},
                                              dict(norm_decay_mult=0.0, bias_decay_mult=0.0))(model)
    names = {id(p): n for n, p in model.named_parameters()}
    heads = {names[id(p)]: (g["lr"], g["weight_decay"]) for g in mmengine.optimizer.param_groups
             for p in g["params"] if not names[id(p)].startswith("backbone.")}
    assert heads and all(plain[n] == v for n, v in heads.items())

    for cfg, message in [
            (dict(layer_decay=0.7), r"paramwise_cfg keys \['layer_decay'\] are not read"),
            (dict(no_decay_norm_bias=True), r"keys \['no_decay_norm_bias'\] are not read.*weight_decay_convention"),
            (dict(layer_decay_rate=0.7, decay_rate=0.7), "both layer_decay_rate and decay_rate"),
            (dict(decay_type="stage_wise"), "decay_type='stage_wise'.*remove decay_type"),
            (dict(num_layers=12 if sum(sizes) != 12 else 11), rf"unique blocks: {sum(sizes)} here"),
            (dict(norm_decay_mult=0.5), "norm_decay_mult=0.5 contradicts weight_decay_convention='norms_and_biases'"),
            (dict(weight_decay_convention="all"), r"weight_decay_convention='all' is not one of \['norms', ")]:
        with pytest.raises(ValueError, match=message):
            built(**cfg)
    without_decay = dict(optim_wrapper, optimizer={k: v for k, v in optim_wrapper["optimizer"].items()
                                                   if k != "weight_decay"})
    with pytest.raises(ValueError, match="needs optim_wrapper.optimizer.weight_decay"):
        lr_and_decay(model, without_decay)


def load_tool(name: str):
    """``tools/<name>.py`` as a fresh module: the tools are scripts, run the way users run them,
    not a package."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def randomize_routers(model, std: float = 0.3):
    """The model with its routers and step transforms drawn at random, standing in for trained
    weights: zero-initialised ones mix every step uniformly, which would hide a wrongly ordered
    mixture."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".router." in name or ".step_transforms." in name:
                p.normal_(0, std)
    return model


def assert_mmengine_resume_restores(runner, ckpt_path, param_name, max_lr):
    """``runner.train()`` stopped right after mmengine resumed ``ckpt_path``: the iteration,
    weights, lr, AdamW moments of ``param_name`` and scheduler steps are the checkpoint's, by value."""
    import pytest
    from mmengine.hooks import Hook

    class Resumed(Exception):
        pass

    class StopAfterResume(Hook):
        def before_train(self, runner):
            raise Resumed

    runner.register_hook(StopAfterResume(), priority="LOWEST")
    with pytest.raises(Resumed):
        runner.train()
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    assert runner.iter == ckpt["meta"]["iter"]
    weights = runner.model.state_dict()
    assert weights.keys() == ckpt["state_dict"].keys()
    assert [k for k, v in ckpt["state_dict"].items() if not torch.equal(weights[k], v)] == []
    optimizer, saved = runner.optim_wrapper.optimizer, ckpt["optimizer"]
    assert [g["lr"] for g in optimizer.param_groups] == [g["lr"] for g in saved["param_groups"]]
    assert 0 < saved["param_groups"][-1]["lr"] < max_lr  # mid-schedule: neither reset nor 0
    param = dict(runner.model.named_parameters())[param_name]
    group, j = next((g, j) for g, params in enumerate(optimizer.param_groups)
                    for j, p in enumerate(params["params"]) if p is param)
    state, saved_state = optimizer.state[param], saved["state"][saved["param_groups"][group]["params"][j]]
    assert saved_state["exp_avg"].abs().sum() > 0
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(state[key], saved_state[key]), key
    assert [s.last_step for s in runner.param_schedulers] == [s["last_step"] for s in ckpt["param_schedulers"]]
    return ckpt


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """This process writes no file beyond ``nbytes`` (``ulimit -f``: what a disk filling up mid-write
    does to a checkpoint); Python ignores the SIGXFSZ, so a write past it fails with EFBIG."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def divergence_report(message: str):
    """(iteration, last checkpoint or None) of a ``faults.divergence_message``, which must also
    name what to try."""
    import re

    match = re.search(r" at iteration (\d+): training stopped; (?:the last checkpoint, '(.+?)', was written|no "
                      r"checkpoint was written).* Try: .*lr", message, re.S)
    assert match, message
    return int(match[1]), match[2]


def assert_mmengine_run_stops_diverged(runner, work):
    """``runner.train()`` (a real divergence, checkpoints every iteration in ``work``) stops
    within 4 iterations naming the iteration, the config key to lower and the last checkpoint,
    which holds finite weights; the diverged iteration was not saved."""
    import pytest

    with pytest.raises(FloatingPointError) as error:
        runner.train()
    iteration, last = divergence_report(str(error.value))
    assert iteration <= 4 and "optim_wrapper.optimizer.lr" in str(error.value)
    assert not (work / f"iter_{iteration}.pth").exists()
    if last is not None:
        assert last == str(work / f"iter_{iteration - 1}.pth")
        weights = torch.load(last, map_location="cpu", weights_only=False)["state_dict"]
        assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())


def interpolated_pos_embed(pos_embed, old_grid, new_grid, num_prefix_tokens=1, mode="bicubic"):
    """A (1, prefix + h*w, D) position table resized from the ``old_grid`` to the ``new_grid``,
    written out independently of the loaders: the prefix entries kept, the grid part
    interpolated as an image (align_corners=False, no antialiasing: timm's
    ``resample_abs_pos_embed``)."""
    import torch.nn.functional as F

    dim = pos_embed.shape[-1]
    grid = pos_embed[:, num_prefix_tokens:].reshape(1, *old_grid, dim).permute(0, 3, 1, 2)
    resized = F.interpolate(grid, size=tuple(new_grid), mode=mode, align_corners=False)
    return torch.cat([pos_embed[:, :num_prefix_tokens], resized.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


def unit_applications(num_blocks: int, num_steps: int, drop_path_rates=None, window_sizes=None):
    """The applications of a unit of its own (``build_schedule`` of one unit), with these
    per-application rates and windows (K * T each, step-major) where given."""
    import dataclasses

    from srvit_backbones.models import build_schedule

    applications = build_schedule((num_blocks,), num_steps, ordinary_blocks=False).applications
    rates = drop_path_rates or [a.drop_path_rate for a in applications]
    windows = window_sizes or [a.window_size for a in applications]
    return tuple(dataclasses.replace(a, drop_path_rate=float(r), window_size=w)
                 for a, r, w in zip(applications, rates, windows, strict=True))


#: the compiled runs of the CPU tests: dynamo's graphs and AOT autograd's forward and backward
#: graphs, run eagerly (inductor's code generation takes minutes on this CPU)
TEST_COMPILE = {"backend": "aot_eager"}


def two_gloo_processes(worker, tmp_path, *args):
    """``worker(rank, *args)`` in 2 forked processes (they need not import the frameworks again),
    each in a gloo process group of 2, one thread each."""
    import torch.multiprocessing as mp

    mp.start_processes(_in_gloo_group, args=(worker, str(tmp_path / "dist_init"), args), nprocs=2, join=True,
                       start_method="fork")


def _in_gloo_group(rank, worker, init_file, args):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        worker(rank, *args)
    finally:
        dist.destroy_process_group()


def assert_compiled_training_equals_eager(train, rtol=1e-4, atol=1e-5):
    """Inside a process group: ``train(compile)`` builds the seeded model with the backbone's
    ``compile`` setting (False, or TEST_COMPILE), wraps it as its framework does for DDP, trains
    it a few steps on this rank's data and returns (losses, model). The compiled run's losses and
    weights equal the eager run's (to float rounding: AOT autograd orders some sums otherwise),
    and its weights are the same on every rank (the gradients were averaged). Returns the
    largest differences."""
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    eager_losses, eager = train(False)
    torch._dynamo.reset()  # compile afresh: no graph of an earlier test (of the parent process) reused
    graphs = counters["stats"]["unique_graphs"]
    losses, compiled = train(dict(TEST_COMPILE))
    assert counters["stats"]["unique_graphs"] > graphs  # the backbone ran compiled
    torch.testing.assert_close(losses, eager_losses, rtol=rtol, atol=atol)
    weights, eager_weights = compiled.state_dict(), eager.state_dict()
    assert weights.keys() == eager_weights.keys()
    for name, value in eager_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=rtol, atol=atol, msg=name)
    flat = torch.cat([p.detach().flatten() for p in compiled.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    assert torch.equal(gathered[0], gathered[1])
    return dict(loss=(losses - eager_losses).abs().max().item(),
                weights=max((weights[n].float() - v.float()).abs().max().item() for n, v in eager_weights.items()))


def assert_mmengine_compiled_training_equals_eager(rank, models, cfg, batches, prepare=lambda ddp: None):
    """``assert_compiled_training_equals_eager`` of the model of an mmengine config (built from
    the ``models`` registry): wrapped as mmengine's Runner wraps it for DDP (its defaults:
    find_unused_parameters=False), ``prepare(ddp)`` (the config's hooks), two ``train_step``s of
    the config's optimizer wrapper, one per batch of this rank's ``batches``."""
    from mmengine.model import MMDistributedDataParallel
    from mmengine.optim import build_optim_wrapper

    def train(compile):
        cfg.model.backbone.compile = compile
        torch.manual_seed(0)
        model = models.build(cfg.model)
        model.init_weights()
        ddp = MMDistributedDataParallel(module=model, broadcast_buffers=False, find_unused_parameters=False)
        prepare(ddp)
        wrapper = build_optim_wrapper(ddp, cfg.optim_wrapper)
        torch.manual_seed(1)  # the heads' sampling: the same draws in both runs
        return torch.stack([ddp.train_step(data, wrapper)["loss"].detach() for data in batches]), model

    differences = assert_compiled_training_equals_eager(train)
    print(f"rank {rank}: compiled - eager after {len(batches)} steps: {differences}")
