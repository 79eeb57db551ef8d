"""tools/plot_curves.py (``srvit_backbones.training.curves``) on the metrics of real short trainings (the
ones test_demo.py draws from, shared through the session's temp folder): panels, lines and their
data (the config's lr schedule, each evaluation at its iteration, AP in percent), and clear
errors. The mmdet quickstart's curves: test_mmdet.py, on its run."""
import json
import os
import shutil

import pytest
from PIL import Image

from helpers import load_tool, scheduled_lrs, trained_detectron2, trained_mmseg
from srvit_backbones.training.curves import CurvesError, plot_curves


@pytest.fixture(scope="session")
def d2_out(tmp_path_factory):
    return trained_detectron2(tmp_path_factory) / "out"


@pytest.fixture(scope="session")
def seg_work(tmp_path_factory):
    return trained_mmseg(tmp_path_factory) / "work"


def lines_of(fig):
    """{panel title: {line label: (xs, ys)}}"""
    return {ax.get_title(): {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
                             for line in ax.get_lines()} for ax in fig.axes}


def records(path):
    return [json.loads(line) for line in open(path)]


def check_png(path, fig):
    assert os.path.isfile(path)
    width, height = fig.get_size_inches() * 100
    assert Image.open(path).size == (round(width), round(height))


def test_detectron2_metrics_json(d2_out, tmp_path, capsys):
    run = records(d2_out / "metrics.json")
    train = [r for r in run if "total_loss" in r]
    evals = [r for r in run if "bbox/AP" in r]
    assert len(train) >= 3 and len(evals) == 1

    fig, path = plot_curves(str(d2_out))
    assert path == os.path.join(str(d2_out), "curves.png")
    check_png(path, fig)
    panels = lines_of(fig)
    assert list(panels) == ["loss", "learning rate", "evaluation"]
    assert set(panels["loss"]) == {k for k in train[0] if k.startswith("loss_")} | {"total_loss"}
    assert panels["loss"]["total_loss"] == ([r["iteration"] for r in train], [r["total_loss"] for r in train])
    assert panels["learning rate"]["lr"] == ([r["iteration"] for r in train], [r["lr"] for r in train])
    # detectron2 logs its largest parameter group's lr: the heads', at the config's lr and schedule
    from detectron2.config import LazyConfig, instantiate

    cfg = LazyConfig.load(str(d2_out / "config.yaml"))
    multiplier = instantiate(cfg.lr_multiplier)
    assert [r["lr"] for r in train] == pytest.approx(
        [cfg.optimizer.lr * multiplier(r["iteration"] / cfg.train.max_iter) for r in train], rel=1e-6)
    assert evals[0]["iteration"] == cfg.train.max_iter  # the final evaluation, after the last iteration
    for metric in ("bbox/AP", "segm/AP"):
        label = f"{metric}: {evals[0][metric]:.4g}"
        assert panels["evaluation"][label] == ([evals[0]["iteration"]], [evals[0][metric]])
    assert len(panels["evaluation"]) == 2  # not the per-class APs

    load_tool("plot_curves").main([str(d2_out / "metrics.json"), "--output", str(tmp_path / "d2.png")])
    assert capsys.readouterr().out.strip() == f"training curves: {tmp_path / 'd2.png'}"
    assert os.path.isfile(tmp_path / "d2.png")


def test_mmseg_scalars_json(seg_work, tmp_path):
    (scalars,) = list(seg_work.glob("*/vis_data/scalars.json"))
    run = records(scalars)
    train = [r for r in run if "loss" in r]
    evals = [r for r in run if "mIoU" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4] and len(evals) == 1

    for source in (seg_work, scalars):  # the work dir or the file
        fig, path = plot_curves(str(source), str(tmp_path / "seg.png"))
        check_png(path, fig)
        panels = lines_of(fig)
        assert list(panels) == ["loss", "learning rate", "evaluation"]
        assert set(panels["loss"]) == {"loss", "decode.loss_ce", "aux.loss_ce"}
        assert panels["loss"]["decode.loss_ce"] == ([1, 2, 3, 4], [r["decode.loss_ce"] for r in train])
        assert panels["learning rate"]["lr"] == ([1, 2, 3, 4], [r["base_lr"] for r in train])
        assert [r["base_lr"] for r in train] == pytest.approx(list(scheduled_lrs(seg_work, [1, 2, 3, 4]).values()))
        assert set(panels["evaluation"]) == {f"{m}: {evals[0][m]:.4g}" for m in ("mIoU", "mAcc", "aAcc")}
        assert panels["evaluation"][f"mIoU: {evals[0]['mIoU']:.4g}"] == ([4], [evals[0]["mIoU"]])
    assert plot_curves(str(scalars))[1] == str(scalars.parent / "curves.png")


def test_a_resumed_mmseg_run_is_joined(seg_work, tmp_path):
    """Two runs in one work dir, the second resumed from iteration 2 (mmseg writes each its own
    TIMESTAMP/vis_data/scalars.json): one line, the later run's values where they overlap."""
    work = tmp_path / "work"
    (first,) = list(seg_work.glob("*/vis_data/scalars.json"))
    shutil.copytree(first.parent.parent, work / "20260101_000000")
    later = [dict(r, step=r["step"] + 2, loss=r["loss"] / 2) for r in records(first) if "loss" in r]
    (work / "20260102_000000" / "vis_data").mkdir(parents=True)
    (work / "20260102_000000" / "vis_data" / "scalars.json").write_text("\n".join(map(json.dumps, later)))

    fig, _ = plot_curves(str(work))
    steps, losses = lines_of(fig)["loss"]["loss"]
    original = {r["step"]: r["loss"] for r in records(first) if "loss" in r}
    assert steps == [1, 2, 3, 4, 5, 6]
    assert losses == [original[1], original[2]] + [original[s] / 2 for s in (1, 2, 3, 4)]


@pytest.mark.parametrize("content,message", [
    ('{"a": 1}\n', "neither Detectron2's metrics.json .* nor mmseg's / mmdet's scalars.json"),
    ("", "neither Detectron2's metrics.json"),
    ("iteration,loss\n1,2.0\n", r"metrics.json:1 is not a JSON line"),
    ('[1, 2]\n', r"metrics.json:1 is not a JSON object"),
    ('{"iteration": 1, "time": 0.5}\n', "holds no loss, lr or bbox/AP"),
])
def test_a_file_of_neither_format_is_explained(tmp_path, content, message):
    (tmp_path / "metrics.json").write_text(content)
    with pytest.raises(CurvesError, match=message):
        plot_curves(str(tmp_path / "metrics.json"))
    assert not (tmp_path / "curves.png").exists()


def test_a_folder_without_metrics_is_explained(tmp_path):
    with pytest.raises(CurvesError, match="holds neither metrics.json .* nor \\*/vis_data/scalars.json"):
        plot_curves(str(tmp_path))
    with pytest.raises(SystemExit, match="does not exist"):  # the tool: the message, exit code 1
        load_tool("plot_curves").main([str(tmp_path / "nowhere")])
