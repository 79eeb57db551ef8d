"""Training curves (tools/plot_curves.py) of detectron2's and mmengine's logs, read as data (``LOG_FORMATS``)."""
import glob
import json
import os
from dataclasses import dataclass
from typing import Dict, Tuple

from matplotlib.figure import Figure

from ..errors import InputError


class CurvesError(InputError, ValueError):
    """A path or a log the curves cannot be drawn from; the message says what was expected."""


@dataclass(frozen=True)
class LogFormat:
    """A framework's training log, as the curves read it."""

    files: str  #: the metrics files in a run's folder (a glob, joined in sorted order)
    iteration: str  #: the key of every record's iteration
    metrics: Tuple[str, ...]  #: the evaluation metrics drawn
    to_percent: float = 1  #: the metrics' factor to percent
    marked_by: Tuple[str, ...] = ()  #: key prefixes that tell this format from another of the same iteration key
    evaluation_by_epoch: bool = False  #: evaluations may be logged at the epoch (log_metric_by_epoch=True)


#: the log formats by framework, in the order they are recognised
LOG_FORMATS: Dict[str, LogFormat] = dict(
    detectron2=LogFormat("metrics.json", "iteration",
                         ("bbox/AP", "segm/AP", "keypoints/AP", "sem_seg/mIoU", "panoptic_seg/PQ")),
    mmdet=LogFormat("*/vis_data/scalars.json", "step",
                    ("coco/bbox_mAP", "coco/segm_mAP", "lvis/bbox_AP", "lvis/segm_AP"), to_percent=100,
                    marked_by=("coco/", "loss_rpn"), evaluation_by_epoch=True),
    mmseg=LogFormat("*/vis_data/scalars.json", "step", ("mIoU", "mAcc", "aAcc"), evaluation_by_epoch=True),
)


def find_files(path):
    """The metrics files of ``path``: the file itself, or a run folder's."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise CurvesError(f"{path} does not exist: give a metrics.json, a scalars.json or a run's output folder")
    for pattern in dict.fromkeys(log.files for log in LOG_FORMATS.values()):
        files = sorted(glob.glob(os.path.join(path, pattern)))
        if files:
            return files
    raise CurvesError(f"{path} holds neither metrics.json (Detectron2's train.output_dir) nor "
                      f"*/vis_data/scalars.json (an mmseg or mmdet work_dir)")


def read_records(files):
    """(framework of ``LOG_FORMATS`` whose log they are, the JSON lines of ``files`` in order)."""
    records = []
    for f in files:
        with open(f) as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise CurvesError(f"{f}:{n} is not a JSON line ({e.msg}): expected Detectron2's metrics.json or "
                                      f"mmseg's / mmdet's vis_data/scalars.json, one JSON object per line") from None
                if not isinstance(record, dict):
                    raise CurvesError(f"{f}:{n} is not a JSON object")
                records.append(record)
    for framework, log in LOG_FORMATS.items():
        if records and all(log.iteration in r for r in records) and (
                not log.marked_by or any(k.startswith(log.marked_by) for r in records for k in r)):
            return framework, records
    raise CurvesError(f"{', '.join(files)}: neither Detectron2's metrics.json (every line has 'iteration') nor "
                      f"mmseg's / mmdet's scalars.json (every line has 'step')")


def series(framework, records):
    """{panel: {name: [(iteration, value), ...]}} for the panels loss, lr (the base lr) and metric."""
    log = LOG_FORMATS[framework]
    panels = {"loss": {}, "lr": {}, "metric": {}}
    last_train_step = 0
    for record in records:
        step = record[log.iteration]
        evaluation = any(name in log.metrics for name in record)
        if log.evaluation_by_epoch and evaluation and step < last_train_step:
            print(f"note: an evaluation logged at step {step}, after iteration {last_train_step} (mmengine's "
                  f"default_hooks.logger.log_metric_by_epoch=True): drawn at iteration {last_train_step}")
            step = last_train_step
        elif not evaluation:
            last_train_step = step
        for name, value in record.items():
            if name in log.metrics:
                panel, value = "metric", value * log.to_percent
            elif name == ("base_lr" if "base_lr" in record else "lr"):
                panel, name = "lr", "lr"
            elif "loss" in name:
                panel = "loss"
            else:
                continue
            points = panels[panel].setdefault(name, {})
            points[step] = value  # a later run's value wins
    return {panel: {name: sorted(points.items()) for name, points in named.items()}
            for panel, named in panels.items() if named}


def plot_curves(path, output=None):
    """Draw the curves of ``path`` (a metrics file or a run's folder) into ``output`` (default: the folder's
    ``curves.png``); returns (figure, PNG path). Raises ``CurvesError`` where there is nothing to draw."""
    files = find_files(path)
    framework, records = read_records(files)
    panels = series(framework, records)
    if not panels:
        raise CurvesError(f"{', '.join(files)} holds no loss, lr or {'/'.join(LOG_FORMATS[framework].metrics)} scalars")
    fig = Figure(figsize=(5 * len(panels), 4), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, sharex=True)[0]
    titles = {"loss": "loss", "lr": "learning rate", "metric": "evaluation"}
    units = {"lr": "base lr (the config's schedule)", "metric": "percent"}
    for ax, (panel, named) in zip(axes, panels.items()):
        for name, points in named.items():
            xs, ys = zip(*points)
            if panel == "metric":  # few points: marked, the last value in the legend
                ax.plot(xs, ys, label=f"{name}: {ys[-1]:.4g}", marker="o")
            else:
                ax.plot(xs, ys, label=name, linewidth=2 if name in ("total_loss", "loss") else 1)
        ax.set(title=titles[panel], xlabel="iteration", ylabel=units.get(panel, ""))
        if panel == "loss" and all(y > 0 for points in named.values() for _, y in points):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{framework}: {os.path.abspath(path)}", fontsize="small")
    if output is None:
        output = os.path.join(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)), "curves.png")
    fig.savefig(output, dpi=100)
    return fig, output
