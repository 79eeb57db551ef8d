"""tools/benchmark.py: speed and peak memory of SR-ViT beside its anchors and timm models, of ``--variant``s, of
whole detectron2 steps (``--detector``), ``--amp`` / ``--compile`` paired against fp32 / eager, and of the
relative-position kernels (``--attention``); models of a mode timed in interleaved rounds in one process (paired
ratios, bootstrap 95% interval), peak memory in a process per model. Modes and examples: docs/tools.md.

    python tools/benchmark.py --model srvit_s_t3 --size 224 --batch-size 8 --references --compile both
"""
import argparse
import collections
import contextlib
import functools
import gc
import json
import multiprocessing
import os
import statistics
import sys
import traceback

import timm
import torch

from ...errors import ConfigError, SRViTError
from ...models import VARIANTS
from ...training import amp
from .attention import ATTENTION_DTYPES, attention_rows, report_attention
from .backbones import (
    REFERENCE_SAME_DEPTH,
    REFERENCE_VITDET,
    SAME_DEPTH,
    backbone_step,
    build,
    parse_variant,
    windowed_variant,
)
from .hardware import machine_record
from .timing import Timer, keep_freed_memory, minor_page_faults, paired_ratios, peak_rss_mib, synchronize

SUBJECTS = ("srvit", "detectron2")  # what is measured; the other kinds are references
SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")  # torch.compile backends --compile-backend takes
SWITCH = {"off": [False], "on": [True], "both": [False, True]}  # --grad-checkpointing, --amp, --compile


# ---------------------------------------------------------------- one job: its model and step
def build_job(job, args, device):
    """(step, parameters in millions, input size) of one job."""
    dtype = getattr(torch, job["amp_dtype"]) if job["amp"] else None
    if job["kind"] == "detectron2":
        from ...detectron2.benchmark import detector_step  # needs detectron2

        step, model, size = detector_step(job["name"], job["overrides"], mode=job["mode"], batch_size=args.batch_size,
                                          device=device, grad_checkpointing=job["grad_checkpointing"], amp_dtype=dtype,
                                          compile=dict(backend=job["compile_backend"]) if job.get("compiled") else None)
    else:
        model = build(job["kind"], job["name"], args.size, job["grad_checkpointing"], job.get("model_args")).to(device)
        compiled = torch.compile(model, backend=job.get("compile_backend") or "inductor") if job.get("compiled") \
            else model
        x = torch.randn(args.batch_size, 3, args.size, args.size, device=device)
        step, size = backbone_step(compiled, job["mode"], x, dtype), args.size
    return step, sum(p.numel() for p in model.parameters()) / 1e6, size


@contextlib.contextmanager
def compile_record():
    """Yields a dict it fills with what dynamo and inductor did inside the block: graph breaks (and
    their reasons), graphs made, FX graph cache hits and misses."""
    from torch._dynamo.utils import counters

    def snapshot():
        return (collections.Counter(counters["graph_break"]), counters["stats"]["unique_graphs"],
                counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])

    record, before = {}, snapshot()
    yield record
    new, graphs, hits, misses = (after - earlier for after, earlier in zip(snapshot(), before))
    record.update(graph_breaks=sum(new.values()), graph_break_reasons=[" ".join(r.split())[:300] for r in new],
                  graphs=graphs, fx_graph_cache=dict(hits=hits, misses=misses))


def time_interleaved(jobs, args, device):
    """Build and warm up every job (a compiled one's first step timed apart), then time
    ``args.repeats`` rounds of one step per job in alternating order; the jobs' rows."""
    if any(job.get("compiled") for job in jobs):
        torch._dynamo.reset()  # compile afresh: no graphs, guards or recompilations of an earlier run
    steps, extras, timers = [], [], []
    for job in jobs:
        step, params_m, size = build_job(job, args, device)
        extra = dict(params_m=params_m, size=size)
        if job.get("compiled"):
            with compile_record() as record:
                first = Timer(device, reset_peak=False)
                with first.step():
                    step()
                for _ in range(args.warmup):
                    step()
            extra.update(first_step_s=first.times[0], **record)
        else:
            for _ in range(args.warmup):
                step()
        synchronize(device)  # the warm-up's queued work done
        steps.append(step)
        extras.append(extra)
        timers.append(Timer(device, reset_peak=False))
    faults = [[] for _ in jobs]
    for r in range(args.repeats):
        for i in (range(len(jobs)) if r % 2 == 0 else reversed(range(len(jobs)))):
            f0 = minor_page_faults()
            with timers[i].step():
                steps[i]()
            faults[i].append(minor_page_faults() - f0)
    rows = []
    for job, extra, timer, f in zip(jobs, extras, timers, faults):
        t = timer.times
        row = dict(job, **extra, batch_size=args.batch_size, times_s=t, step_started=timer.started,
                   median_s=statistics.median(t), min_s=min(t), max_s=max(t),
                   img_per_s=args.batch_size / statistics.median(t), minor_page_faults=f)
        if "first_step_s" in row:
            row["compile_s"] = row["first_step_s"] - row["median_s"]
        rows.append(row)
    return rows


# ---------------------------------------------------------------- peak memory, one process per job
def peak_memory_process(job, args, results):
    """In a process of its own: two steps of the job; sends their peak memory (or the error) to ``results``."""
    try:
        device = torch.device(args.device)
        rss_before = peak_rss_mib()
        step = build_job(job, args, device)[0]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        for _ in range(2):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize()
            results.send(dict(peak_mib=torch.cuda.max_memory_allocated() / 2 ** 20, peak_kind="cuda_max_allocated_mib"))
        else:
            results.send(dict(peak_mib=peak_rss_mib() - rss_before, peak_kind="cpu_peak_rss_growth_mib"))
    except BaseException:
        results.send(dict(error=traceback.format_exc()))


def memory_processes():
    """The peak-memory processes' context: forkserver (torch imported once; not forked from the timing
    process, its CUDA context and allocator), spawn where the platform has no fork."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["__main__", __name__])
    return context


def measure_peak_memory(job, args):
    context = memory_processes()
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=peak_memory_process, args=(job, args, send), daemon=True)
    process.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:  # it died without sending (killed for memory, ...)
        result = dict(error="the process ended without a result")
    process.join()
    if "error" in result:
        raise SRViTError(f"peak-memory measurement failed ({label(job)}):\n{result['error'][-3000:]}")
    return result


def release_device_memory(device):
    """Hand back what the timing process held on the GPU before the memory processes start."""
    gc.collect()
    if device.type == "cuda":
        torch._dynamo.reset()  # compiled code keeps its model alive
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- comparisons and report
def label(row):
    if row["kind"] == REFERENCE_SAME_DEPTH:
        name = f"timm ViT depth={_deff(row['name'])}"
    elif row["kind"] == REFERENCE_VITDET:
        name = f"detectron2 ViTDet depth={_deff(row['name'])}"
    elif row["kind"] == "detectron2":
        name = os.path.splitext(os.path.basename(row["name"]))[0]
    else:
        name = row["name"] + (f"[{row['variant']}]" if row.get("variant") else "")
    return (f"{name} {row['mode']}" + (" ckpt" if row["grad_checkpointing"] else "")
            + (f" {SHORT_DTYPE.get(row['amp_dtype'], row['amp_dtype'])}" if row["amp"] else "")
            + (" compiled" if row.get("compiled") else ""))


@functools.lru_cache(maxsize=None)
def _deff(name):
    return timm.create_model(name, num_classes=0, img_size=32).effective_depth


def paired_ratio(a, b):
    """Rows a / b: their paired time ratios, the ratio of their best times, of their peak memory
    and their parameter difference."""
    return dict(a=label(a), b=label(b), **paired_ratios(a["times_s"], b["times_s"]),
                best_ratio=a["min_s"] / b["min_s"],
                peak_ratio=a["peak_mib"] / b["peak_mib"] if a["peak_mib"] and b["peak_mib"] else None,
                params_diff_m=a["params_m"] - b["params_m"])


def model_key(row):
    return row["kind"], row["name"], row.get("variant"), tuple(row.get("overrides", ()))


def comparisons(rows):
    """Within a mode, each measured model against every reference and the first measured model (alike
    otherwise), and against itself without checkpointing, autocast or compilation."""
    subjects = [r for r in rows if r["kind"] in SUBJECTS]
    first = model_key(subjects[0]) if subjects else None
    out = []
    for a in subjects:
        for b in rows:
            if b is a or b["mode"] != a["mode"]:
                continue
            differ = [(bool(a.get(k)), bool(b.get(k))) for k in ("grad_checkpointing", "amp", "compiled")
                      if bool(a.get(k)) != bool(b.get(k))]  # the switches a and b differ in
            if (differ == [(True, False)]) if model_key(b) == model_key(a) else \
                    (not differ and (b["kind"] not in SUBJECTS or model_key(b) == first)):
                out.append(paired_ratio(a, b))
    return out


def report(rows, ratios):
    width = max(len(label(r)) for r in rows) + 2
    print(f"{'model':<{width}} {'params M':>9} {'median s':>9} {'spread s':>17} {'img/s':>8} {'peak MiB':>9}")
    for r in rows:
        peak = f"{r['peak_mib']:>9.0f}" if r["peak_mib"] is not None else f"{'-':>9}"
        print(f"{label(r):<{width}} {r['params_m']:>9.3f} {r['median_s']:>9.4f} {r['min_s']:>8.4f}-{r['max_s']:<8.4f} "
              f"{r['img_per_s']:>8.2f} {peak}")
    for r in rows:
        if "first_step_s" in r:
            print(f"{label(r)}: first (compiling) step {r['first_step_s']:.2f} s, compile {r['compile_s']:.2f} s, "
                  f"{r['graph_breaks']} graph breaks, {r['graphs']} graphs, FX graph cache {r['fx_graph_cache']}")
    print("\ntime ratios: median of the per-round ratios [bootstrap 95% interval] (min-max), ratio of the best "
          "times; throughput ratio = 1 / time ratio")
    for c in ratios:
        peak = f", peak memory ratio {c['peak_ratio']:.3f}" if c["peak_ratio"] else ""
        params = f", params {c['params_diff_m']:+.3f}M" if c["params_diff_m"] else ""
        print(f"{c['a']} / {c['b']}: {c['median']:.3f} [{c['ci95'][0]:.3f}, {c['ci95'][1]:.3f}] "
              f"({c['min']:.3f}-{c['max']:.3f}), best {c['best_ratio']:.3f}{peak}{params}")


# ---------------------------------------------------------------- command line
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="tools/benchmark.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="srvit_s_t3", help="SR-ViT variant")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:key=value,...",
                   help="--model with these core arguments (Python literals); repeat to compare, the first is "
                        "the baseline; e.g. --variant global: --variant win:window_size=14,use_rel_pos=True")
    p.add_argument("--detector", nargs="+", metavar="CONFIG",
                   help="time whole detectron2 steps of these LazyConfigs (paths or shipped names) at their input size")
    p.add_argument("--detector-opts", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides applied to every --detector config, as tools/train_net.py takes them")
    p.add_argument("--size", type=int, default=224, help="224 (classification), 512 (seg), 1024 (det)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    p.add_argument("--grad-checkpointing", choices=list(SWITCH), default="off", help="in the training step")
    p.add_argument("--references", nargs="*", default=[REFERENCE_SAME_DEPTH, "deit_small_patch16_224",
                                                        "deit_base_patch16_224"],
                   help=f"{REFERENCE_SAME_DEPTH}, {REFERENCE_VITDET} (needs detectron2 and a windowed --variant) "
                        "and/or timm models; none: SR-ViT alone")
    p.add_argument("--attention", action="store_true",
                   help="time the relative-position attention kernels at --size (global grid, 14x14 windows)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (one step per model each)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", nargs="?", const="on", default="off", choices=list(SWITCH),
                   help="autocast (fp16 on CUDA, bf16 on a CPU with native bf16); 'both': with and without")
    p.add_argument("--compile", nargs="?", const="on", default="off", choices=list(SWITCH),
                   help="torch.compile the models; 'both': compiled and eager, paired")
    p.add_argument("--compile-backend", default="inductor", choices=COMPILE_BACKENDS,
                   help="torch.compile's backend (aot_eager / eager: a quick look without inductor)")
    p.add_argument("--peak-memory", choices=["process", "off"], default="process",
                   help="each model's peak memory in a process of its own after the timing, or not measured")
    p.add_argument("--json", help="write results here")
    p.add_argument("--default-malloc", action="store_true",
                   help="time with the C library's default allocator settings (see keep_freed_memory)")
    return p.parse_args(argv)


def check_args(args):
    """The parsed variants [(name, core arguments)] and autocast dtype name (None without --amp);
    a ``ConfigError`` listing every problem with the arguments, each with what to do."""
    errors, variants, dtype = [], [], None
    if args.model not in VARIANTS:
        errors.append(f"unknown --model {args.model!r}; known: {', '.join(VARIANTS)}")
    if args.size < 16 or args.size % 16:
        errors.append(f"--size {args.size} is not a positive multiple of the patch size 16")
    if args.batch_size < 1 or args.warmup < 0 or args.repeats < 1:
        errors.append("--batch-size and --repeats must be >= 1, --warmup >= 0")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        errors.append(f"--device {args.device}: CUDA is not available here; use --device cpu")
    elif args.amp != "off":
        try:
            dtype = str(amp.amp_dtype(args.device)).replace("torch.", "")
        except ValueError as e:
            errors.append(str(e))
    if args.compile == "off" and args.compile_backend != "inductor":
        errors.append(f"--compile-backend {args.compile_backend} chooses --compile's backend: add --compile")
    if args.attention and (args.detector or args.variant or args.amp != "off" or args.compile != "off"):
        errors.append("--attention times the attention kernels alone, in both of the device's precisions "
                      f"({', '.join(ATTENTION_DTYPES['cuda' if args.device.startswith('cuda') else 'cpu'])}): "
                      "drop --detector, --variant, --amp and --compile")
    if args.detector:
        if args.variant:
            errors.append("--variant changes the --model backbone; with --detector pass config overrides "
                          "with --detector-opts (e.g. model.backbone.net.window_size=14)")
    else:
        for ref in args.references:
            if ref not in SAME_DEPTH and not timm.is_model(ref):
                errors.append(f"--references {ref!r} is neither one of {SAME_DEPTH} nor a timm model name")
        for spec in args.variant:
            try:
                variants.append(parse_variant(spec))
            except ValueError as e:
                errors.append(str(e))
        if REFERENCE_VITDET in args.references and not windowed_variant(variants):
            errors.append(f"--references {REFERENCE_VITDET} mirrors a windowed model: add a --variant with windows, "
                          f"e.g. --variant win:window_size=14,use_rel_pos=True")
        names = [name for name, _ in variants]
        if len(set(names)) != len(names):
            errors.append(f"--variant names must differ, got {names}")
    if not errors and variants:  # the core's own checks (a window size < 0, ...), before any timing
        for name, kwargs in variants:
            try:
                build("srvit", args.model, args.size, False, kwargs)
            except (TypeError, ValueError) as e:
                errors.append(f"--variant {name}: {args.model} refuses {kwargs}: {e}")
    if not errors and args.detector:  # a wrong name or a config without an input size, before any timing
        from ...detectron2.benchmark import detector_config  # needs detectron2

        for config in args.detector:
            try:
                detector_config(config, args.detector_opts)
            except (FileNotFoundError, ValueError) as e:
                errors.append(str(e))
    if errors:
        raise ConfigError("benchmark: " + "; ".join(errors))
    return variants, dtype


def make_jobs(args, variants, dtype, mode):
    ckpt, amps, compiles = (SWITCH[v] for v in (args.grad_checkpointing, args.amp, args.compile))
    if args.detector:
        models = [dict(kind="detectron2", name=c, overrides=list(args.detector_opts)) for c in args.detector]
    else:
        models = ([dict(kind="srvit", name=args.model, variant=name, model_args=kwargs) for name, kwargs in variants]
                  or [dict(kind="srvit", name=args.model)])
        models += [dict(kind=REFERENCE_SAME_DEPTH, name=args.model) if r == REFERENCE_SAME_DEPTH
                   else dict(kind=REFERENCE_VITDET, name=args.model, model_args=windowed_variant(variants))
                   if r == REFERENCE_VITDET else dict(kind="timm", name=r) for r in args.references]
    return [dict(m, mode=mode, grad_checkpointing=c, amp=a, amp_dtype=dtype if a else None, compiled=compiled,
                 **(dict(compile_backend=args.compile_backend) if compiled else {}))
            for m in models for c in (ckpt if mode == "train" else [False]) for a in amps for compiled in compiles]


def main(argv=None):
    """tools/benchmark.py: parse ``argv``, time, print the table.

    Returns:
        The result written to ``--json`` (command, machine, method, rows, comparisons).

    Raises:
        ConfigError: arguments that cannot run.
    """
    args = parse_args(argv)
    variants, dtype = check_args(args)
    device = torch.device(args.device)
    command = " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]] if argv is None else ["tools/benchmark.py", *argv])
    if args.attention:
        rows = attention_rows(args.size, args.batch_size, device, args.warmup, args.repeats)
        report_attention(rows)
        result = dict(command=command, rows=rows, machine=machine_record(device))
    else:
        torch.manual_seed(0)
        malloc = None if args.default_malloc else keep_freed_memory()
        rows = []
        for mode in args.modes:
            jobs = make_jobs(args, variants, dtype, mode)
            timed = time_interleaved(jobs, args, device)
            release_device_memory(device)
            rows += [dict(row, **(measure_peak_memory(job, args) if args.peak_memory == "process"
                                  else dict(peak_mib=None, peak_kind="not measured (--peak-memory off)")))
                     for job, row in zip(jobs, timed)]
        ratios = comparisons(rows)
        report(rows, ratios)
        machine = dict(machine_record(device), timm=timm.__version__)
        if args.detector:
            import detectron2
            machine["detectron2"] = detectron2.__version__
        result = dict(command=command, machine=machine,
                      method=dict(time="interleaved rounds in one process", malloc=malloc or "default",
                                  peak_memory="one process per model after the timing, default allocator"
                                  if args.peak_memory == "process" else "not measured (--peak-memory off)",
                                  amp_dtype=dtype),
                      rows=rows, comparisons=ratios)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result

