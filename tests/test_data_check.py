"""tools/check_data.py and the check the training tools run first: on synthetic custom sets (the
quickstart generators' --categories / --classes layouts) with one planted defect of each kind,
every kind is named with its file; on the clean sets, nothing is reported."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from helpers import D2_QUICKSTART, ROOT, SEG_QUICKSTART, load_tool
from srvit_backbones.data.check import KINDS, CocoSplit, SegSplit, check_splits

MMDET_QUICKSTART = os.path.join(ROOT, "mmdet_configs", "quickstart", "mask_rcnn_srvit_tiny_cpu.py")
DET_CLASSES = ["disc", "box", "wedge"]
SEG_CLASSES = ["ground", "disc", "box", "wedge", "gem"]


def make_custom_sets(root):
    """A 3-class COCO-format set (ROOT/det) and a 5-class segmentation set (ROOT/seg), the
    generators' custom layouts."""
    for script, args in (("make_synthetic_coco.py", ["--root", str(root / "det"), "--categories", *DET_CLASSES]),
                         ("make_synthetic_ade20k.py", ["--root", str(root / "seg"), "--classes", *SEG_CLASSES])):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", script), *args, "--train", "6", "--val", "2",
                        "--size", "64", "80"], check=True, capture_output=True)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    make_custom_sets(root)
    return root


def plant_detection_defects(det):
    """One defect of each detection kind in a copy of the custom set; {kind: the file named}."""
    ann_path = det / "annotations" / "train.json"
    data = json.loads(ann_path.read_text())
    images, anns = data["images"], data["annotations"]
    first_ann = {}
    for ann in anns:
        first_ann.setdefault(ann["image_id"], ann)
    name = {entry["id"]: entry["file_name"] for entry in images}
    planted = {}

    def image(i):
        return det / "train" / images[i]["file_name"]

    images.append(dict(id=100, file_name="gone.jpg", width=80, height=64))
    planted["missing_image"] = "gone.jpg"
    image(0).write_bytes(b"not an image")
    planted["unreadable_image"] = images[0]["file_name"]
    image(1).write_bytes(image(1).read_bytes()[:-200])
    planted["truncated_image"] = images[1]["file_name"]
    images[2]["width"] = 81
    planted["size_mismatch"] = images[2]["file_name"]
    a, b, c = (first_ann[images[i]["id"]] for i in (3, 4, 5))
    a["bbox"][2] = 0
    planted["empty_box"] = name[a["image_id"]]
    b["bbox"] = [70.0, 10.0, 30.0, 20.0]
    planted["box_outside_image"] = name[b["image_id"]]
    c["segmentation"] = [[1, 1, 5, 5]]
    planted["short_polygon"] = name[c["image_id"]]
    anns.append(dict(first_ann[images[2]["id"]], id=1000, category_id=99))
    planted["unknown_category"] = name[images[2]["id"]]
    anns.append(dict(first_ann[images[2]["id"]], id=1001, image_id=555))
    planted["unknown_image_id"] = "annotation 1001"
    Image.new("L", (80, 64), 128).save(det / "train" / "gray.png")
    Image.new("RGBA", (80, 64)).save(det / "train" / "alpha.png")
    Image.fromarray(np.full((64, 80), 4000, dtype=np.uint16)).save(det / "train" / "deep.png")
    for i, file_name in enumerate(("gray.png", "alpha.png", "deep.png")):  # images without annotations
        images.append(dict(id=200 + i, file_name=file_name, width=80, height=64))
    planted.update(grayscale_image="gray.png", alpha_image="alpha.png", high_bit_depth_image="deep.png",
                   unannotated_image="gray.png")
    ann_path.write_text(json.dumps(data))
    return planted


def plant_segmentation_defects(seg):
    """One defect of each segmentation kind in a copy of the custom set; {kind: the file named}."""
    images, labels = seg / "images" / "train", seg / "labels" / "train"
    stems = sorted(p.stem for p in images.iterdir())
    (labels / f"{stems[0]}.png").unlink()
    (labels / f"{stems[1]}.png").write_bytes(b"broken")
    Image.new("L", (40, 32)).save(labels / f"{stems[2]}.png")
    Image.new("RGB", (80, 64)).save(labels / f"{stems[3]}.png")
    label = np.array(Image.open(labels / f"{stems[4]}.png"))
    label[10, 10] = 7  # 5 classes: 0..4 and 255
    Image.fromarray(label).save(labels / f"{stems[4]}.png")
    Image.new("L", (80, 64)).save(labels / "orphan.png")
    return {"missing_label": f"{stems[0]}.jpg", "unreadable_label": f"{stems[1]}.png",
            "label_size_mismatch": f"{stems[2]}.png", "label_not_single_channel": f"{stems[3]}.png",
            "label_out_of_range": f"{stems[4]}.png", "label_without_image": "orphan.png"}


def test_every_planted_defect_is_named_and_a_clean_set_is_silent(clean, tmp_path):
    shutil.copytree(clean / "det", tmp_path / "det")
    shutil.copytree(clean / "seg", tmp_path / "seg")
    planted = plant_detection_defects(tmp_path / "det")
    planted.update(plant_segmentation_defects(tmp_path / "seg"))
    assert set(planted) == set(KINDS) - {"missing_annotation_file", "bad_annotation_file"}

    def splits(root):
        return [CocoSplit("det", str(root / "det" / "annotations" / "train.json"), str(root / "det" / "train")),
                SegSplit("seg", str(root / "seg" / "images" / "train"), str(root / "seg" / "labels" / "train"), 5)]

    found = {}
    for report in check_splits(splits(tmp_path)):
        for finding in report.findings:
            found[finding.kind] = (finding.count, " ".join(finding.examples))
    assert set(found) == set(planted)
    for kind, name in planted.items():
        assert name in found[kind][1], (kind, found[kind])
    # gone.jpg and the three mode images have no annotation
    assert found["unannotated_image"][0] == 4
    assert ({k: found[k][0] for k in planted if k != "unannotated_image"}
            == {k: 1 for k in planted if k != "unannotated_image"})

    reports = check_splits(splits(clean))
    assert [r.findings for r in reports] == [[], []] and all(r.files > 6 for r in reports)

    (tmp_path / "bad.json").write_text("{")
    kinds = [f.kind for r in check_splits([CocoSplit("a", str(tmp_path / "none.json"), str(tmp_path)),
                                           CocoSplit("b", str(tmp_path / "bad.json"), str(tmp_path))])
             for f in r.findings]
    assert kinds == ["missing_annotation_file", "bad_annotation_file"]


def test_check_data_tool_exits_1_naming_defects_in_every_framework(clean, tmp_path, capsys):
    """tools/check_data.py on each framework's quickstart config with the custom sets: silent
    (exit 0, no finding) when clean; a defect: exit status 1, the kind, the file and the fix."""
    check_data = load_tool("check_data")
    det, seg = clean / "det", clean / "seg"
    coco = ["--coco-train", str(det / "annotations" / "train.json"), str(det / "train"),
            "--coco-val", str(det / "annotations" / "val.json"), str(det / "val")]
    segmentation = ["--seg-train", str(seg / "images" / "train"), str(seg / "labels" / "train"),
                    "--seg-val", str(seg / "images" / "val"), str(seg / "labels" / "val"),
                    "--classes", str(seg / "classes.txt")]
    for config, args in ((D2_QUICKSTART, coco), (MMDET_QUICKSTART, coco), (SEG_QUICKSTART, segmentation)):
        check_data.main([config, *args])
        out = capsys.readouterr().out
        assert "no errors" in out and "ERROR" not in out and "NOTE" not in out, out

    broken = tmp_path / "det"
    shutil.copytree(det, broken)
    (broken / "val" / "000000000001.jpg").unlink()
    coco_broken = [a.replace(str(det), str(broken)) for a in coco]
    for config in (D2_QUICKSTART, MMDET_QUICKSTART):
        with pytest.raises(SystemExit) as exit_info:
            check_data.main([config, *coco_broken])
        message = str(exit_info.value.code)
        assert "ERROR missing_image: 1 images" in message and "000000000001.jpg" in message, message
        assert "fix: put the files under the image folder" in message

    # a config whose head does not fit the data: both numbers named
    with pytest.raises(SystemExit, match=r"model.roi_heads.num_classes=2 but .* has 3 categories"):
        check_data.main([D2_QUICKSTART, *coco, "model.roi_heads.num_classes=2"])
    with pytest.raises(SystemExit, match=r"model.decode_head.num_classes=4 but .* has 5 classes \(ground, disc"):
        check_data.main([SEG_QUICKSTART, *segmentation, "--cfg-options", "model.decode_head.num_classes=4"])
    with pytest.raises(SystemExit, match=r"model.roi_head.bbox_head.num_classes=80 but .* has 3 classes"):
        check_data.main([MMDET_QUICKSTART, *coco, "--cfg-options", "model.roi_head.bbox_head.num_classes=80"])
