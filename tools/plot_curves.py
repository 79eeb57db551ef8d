#!/usr/bin/env python
"""Training curves as a picture: loss(es), learning rate and the evaluation metric(s) over
iterations, from a Detectron2 run's ``metrics.json`` or an MMSegmentation / MMDetection run's
``vis_data/scalars.json`` (both one JSON object per line), or from the run's folder:

    python tools/plot_curves.py output/quickstart_detectron2            # -> output/quickstart_detectron2/curves.png
    python tools/plot_curves.py output/quickstart_mmseg --output mmseg.png
    python tools/plot_curves.py output/quickstart_mmdet

An mmengine work dir (mmseg, mmdet) holds one ``TIMESTAMP/vis_data/scalars.json`` per run (a
resumed run adds one): they are joined in time order, a later run's value winning where runs
overlap.
"""
import argparse
import glob
import json
import os

from matplotlib.figure import Figure

# headline evaluation metrics; detectron2 also logs per-class APs, not drawn
METRICS = {"detectron2": ("bbox/AP", "segm/AP", "keypoints/AP", "sem_seg/mIoU", "panoptic_seg/PQ"),
           "mmseg": ("mIoU", "mAcc", "aAcc"), "mmdet": ("coco/bbox_mAP", "coco/segm_mAP")}
ITERATION = {"detectron2": "iteration", "mmseg": "step", "mmdet": "step"}


def find_files(path):
    """The metrics files of ``path``: the file itself, or a run folder's."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise SystemExit(f"{path} does not exist: give a metrics.json, a scalars.json or a run's output folder")
    files = glob.glob(os.path.join(path, "metrics.json")) or \
        sorted(glob.glob(os.path.join(path, "*", "vis_data", "scalars.json")))
    if not files:
        raise SystemExit(f"{path} holds neither metrics.json (Detectron2's train.output_dir) nor "
                         f"*/vis_data/scalars.json (an mmseg or mmdet work_dir)")
    return files


def read_records(files):
    """(framework, records): the JSON lines of the files, in order."""
    records = []
    for f in files:
        with open(f) as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{f}:{n} is not a JSON line ({e.msg}): expected Detectron2's metrics.json or "
                                     f"mmseg's / mmdet's vis_data/scalars.json, one JSON object per line") from None
                if not isinstance(record, dict):
                    raise SystemExit(f"{f}:{n} is not a JSON object")
                records.append(record)
    if records and all("iteration" in r for r in records):
        return "detectron2", records
    if records and all("step" in r for r in records):  # mmengine's: a detector's logs name its COCO metrics
        detection = any(k.startswith(("coco/", "loss_rpn")) for r in records for k in r)
        return ("mmdet" if detection else "mmseg"), records
    raise SystemExit(f"{', '.join(files)}: neither Detectron2's metrics.json (every line has 'iteration') nor "
                     f"mmseg's / mmdet's scalars.json (every line has 'step')")


def series(framework, records):
    """{panel: {name: [(iteration, value), ...]}} for the panels loss, lr and metric."""
    it_key = ITERATION[framework]
    panels = {"loss": {}, "lr": {}, "metric": {}}
    for record in records:
        for name, value in record.items():
            if name in METRICS[framework]:
                panel = "metric"
            elif name == "lr":
                panel = "lr"
            elif "loss" in name:
                panel = "loss"
            else:
                continue
            points = panels[panel].setdefault(name, {})
            points[record[it_key]] = value  # a later run's value wins
    return {panel: {name: sorted(points.items()) for name, points in named.items()}
            for panel, named in panels.items() if named}


def plot_curves(path, output=None):
    """Draw the run's curves; returns (figure, PNG path). One panel per kind found, in the
    order loss, lr, metric; each line labelled with its scalar's name (metrics: and last value)."""
    files = find_files(path)
    framework, records = read_records(files)
    panels = series(framework, records)
    if not panels:
        raise SystemExit(f"{', '.join(files)} holds no loss, lr or {'/'.join(METRICS[framework])} scalars")
    fig = Figure(figsize=(5 * len(panels), 4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharex=True)[0]
    titles = {"loss": "loss", "lr": "learning rate", "metric": "evaluation"}
    for ax, (panel, named) in zip(axes, panels.items()):
        for name, points in named.items():
            xs, ys = zip(*points)
            if panel == "metric":  # few points: marked, the last value in the legend
                ax.plot(xs, ys, label=f"{name}: {ys[-1]:.4g}", marker="o")
            else:
                ax.plot(xs, ys, label=name, linewidth=2 if name in ("total_loss", "loss") else 1)
        ax.set_title(titles[panel])
        ax.set_xlabel("iteration")
        if panel == "loss" and all(y > 0 for points in named.values() for _, y in points):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{framework}: {os.path.abspath(path)}", fontsize="small")
    if output is None:
        output = os.path.join(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)), "curves.png")
    fig.savefig(output, dpi=100)
    return fig, output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="metrics.json, scalars.json, or a run's output / work dir")
    parser.add_argument("--output", help="PNG to write (default: curves.png in the run's folder)")
    args = parser.parse_args(argv)
    _, output = plot_curves(args.path, args.output)
    print(f"training curves: {output}")


if __name__ == "__main__":
    main()
