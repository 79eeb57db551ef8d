"""A check of a dataset's files before a long run: every image header and annotation read once,
each defect counted with the first file names and the fix, so that a missing image stops the run
before the model is built, not hours in.

Two layouts: ``CocoSplit`` (a COCO-format JSON and its image folder: detectron2, mmdet) and
``SegSplit`` (image and label-map folders paired by stem: mmseg). Images are checked from their
headers and end markers without decoding; label maps are decoded (their values are checked).
"""
import json
import os
import time
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import numpy as np
from PIL import Image

from ..errors import DataCheckError

#: how many file names a finding quotes
EXAMPLES = 5
#: box coordinates may pass the image border by this much (rounding in labelling tools) before
#: the box counts as outside it
BORDER_TOLERANCE = 1.0
_EXIF_ORIENTATION = 0x0112
_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height

#: kind -> (severity, what it is, what to do); "error" stops the run, "note" is reported
KINDS: Dict[str, Tuple[str, str, str]] = {
    "missing_image": ("error", "images listed in the annotations but not found",
                      "put the files under the image folder, fix the image folder in the config, or remove "
                      "their entries from the annotation file"),
    "unreadable_image": ("error", "files that are not a readable image",
                         "replace them with valid JPEG/PNG files or remove their entries"),
    "truncated_image": ("error", "truncated images (the file ends before the image's end marker: a copy or "
                                 "download cut short)", "copy or download them again"),
    "size_mismatch": ("error", "images whose size (after EXIF rotation) differs from the annotation's "
                               "width x height", "fix width/height in the annotation file, or re-export the "
                                                 "image at the annotated size"),
    "empty_box": ("error", "boxes of zero or negative width or height",
                  "remove these annotations or fix their bbox [x, y, width, height]"),
    "box_outside_image": ("error", f"boxes outside the image (by more than {BORDER_TOLERANCE:g} pixel)",
                          "clip the boxes to the image or fix the image's width/height"),
    "short_polygon": ("error", "polygons with fewer than 3 points",
                      "remove these polygons (a mask needs at least 3 points: 6 numbers)"),
    "unknown_category": ("error", "annotations whose category_id is not in the file's categories",
                         "add the category to 'categories' or remove these annotations"),
    "unknown_image_id": ("error", "annotations whose image_id is not in the file's images",
                         "add the image to 'images' or remove these annotations"),
    "missing_annotation_file": ("error", "annotation files not found",
                                "check the path: detectron2 reads the registered json_file (builtin "
                                "datasets: below $DETECTRON2_DATASETS), mmdet data_root + ann_file; to try "
                                "the tools without COCO: python tools/make_synthetic_coco.py --root datasets, "
                                "then DETECTRON2_DATASETS=datasets (see make quickstart-detectron2)"),
    "bad_annotation_file": ("error", "annotation files that are not COCO-format JSON",
                            "export the annotations as COCO JSON (images, annotations, categories)"),
    "missing_label": ("error", "images without a label map",
                      "add the label map (same stem, the config's seg_map_suffix) or remove the image"),
    "unreadable_label": ("error", "label maps that are not a readable image (or are truncated)",
                         "export them again as single-channel PNG"),
    "label_size_mismatch": ("error", "label maps whose size differs from their image's",
                            "export each label map at its image's size"),
    "label_not_single_channel": ("error", "label maps with colour channels (RGB/RGBA): the frameworks read "
                                          "class indices from a single-channel or palette PNG",
                                 "convert the colours to class indices (a mode 'L' or 'P' PNG)"),
    "label_out_of_range": ("error", "label maps holding values outside the classes and the ignore value",
                           "fix the label maps, or the class list (its length) and reduce_zero_label"),
    "unannotated_image": ("note", "images without annotations",
                          "detectron2 and mmdet skip them in training (filter_empty_gt), evaluation keeps them"),
    "grayscale_image": ("note", "grayscale images", "read as 3-channel colour images (the gray value copied)"),
    "alpha_image": ("note", "images with an alpha channel (RGBA, LA, palette with transparency)",
                    "read as 3-channel colour images: the alpha channel is dropped"),
    "high_bit_depth_image": ("note", "16- or 32-bit images",
                             "read as 8-bit colour images by each framework's decoder; convert them to "
                             "8 bits yourself to choose the scaling"),
    "label_without_image": ("note", "label maps without an image", "they are not used"),
}


class Finding(NamedTuple):
    kind: str
    count: int
    examples: List[str]


@dataclass
class SplitReport:
    """What the check found in one split (``where``: the config entry it came from)."""
    where: str
    description: str
    files: int = 0
    counts: Dict[str, int] = field(default_factory=dict)
    examples: Dict[str, List[str]] = field(default_factory=dict)

    def add(self, kind: str, example: str) -> None:
        assert kind in KINDS, kind
        self.counts[kind] = self.counts.get(kind, 0) + 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES:
            shown.append(example)

    @property
    def findings(self) -> List[Finding]:
        order = list(KINDS)
        return [Finding(k, self.counts[k], self.examples[k]) for k in sorted(self.counts, key=order.index)]

    def format(self) -> str:
        lines = [f"{self.where}: {self.description}: {self.files} files read"]
        for kind, count, examples in self.findings:
            severity, what, fix = KINDS[kind]
            shown = ", ".join(examples) + (", ..." if count > len(examples) else "")
            lines.append(f"  {severity.upper()} {kind}: {count} {what}: {shown}\n    fix: {fix}")
        return "\n".join(lines)


@dataclass
class CocoSplit:
    """A COCO-format annotation file and the folder its ``file_name``s are relative to."""
    where: str
    ann_file: str
    image_dir: str


@dataclass
class SegSplit:
    """mmseg's folder pair: ``image_dir/STEM{img_suffix}`` with ``label_dir/STEM{seg_map_suffix}``
    (the stems of ``split_file`` when given, else every image below ``image_dir``). Valid label
    values: 0..num_classes-1 and ``ignore_index``, read after ``reduce_zero_label`` (0 -> ignore,
    v -> v - 1)."""
    where: str
    image_dir: str
    label_dir: str
    num_classes: int
    img_suffix: str = ".jpg"
    seg_map_suffix: str = ".png"
    reduce_zero_label: bool = False
    ignore_index: int = 255
    split_file: Optional[str] = None


def check_image(report: SplitReport, path: str, name: str) -> Optional[Tuple[int, int]]:
    """The image's (width, height) as displayed (after EXIF rotation), read from its header, its
    defects (a JPEG or PNG without its end marker: truncated) added to ``report``; None when unreadable."""
    report.files += 1
    try:
        with open(path, "rb") as f:
            with Image.open(f) as image:
                (width, height), mode, fmt = image.size, image.mode, image.format
                if fmt == "JPEG" and image.getexif().get(_EXIF_ORIENTATION) in _TRANSPOSED:
                    width, height = height, width
                mode = "PA" if mode == "P" and "transparency" in image.info else mode
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64))
            tail = f.read()
    except FileNotFoundError:
        report.add("missing_image", name)
        return None
    except (OSError, ValueError, SyntaxError):  # PIL's UnidentifiedImageError is an OSError
        report.add("unreadable_image", name)
        return None
    # a few bytes of padding after a JPEG's EOI marker are common
    if fmt == "PNG" and b"IEND" not in tail[-12:] or fmt == "JPEG" and b"\xff\xd9" not in tail:
        report.add("truncated_image", name)
    if mode in ("L", "1", "LA"):
        report.add("grayscale_image", name)
    if mode in ("RGBA", "LA", "PA"):
        report.add("alpha_image", name)
    if mode.startswith("I") or mode == "F":
        report.add("high_bit_depth_image", name)
    return width, height


def _box_defect(bbox, width: float, height: float) -> Optional[str]:
    x, y, w, h = (float(v) for v in bbox)
    if not (w > 0 and h > 0):
        return "empty_box"
    t = BORDER_TOLERANCE
    if x < -t or y < -t or x + w > width + t or y + h > height + t:
        return "box_outside_image"
    return None


def image_file_name(entry: dict) -> str:
    """An image entry's file below the image folder: COCO's ``file_name``, or for LVIS v1 the
    last two parts of its ``coco_url`` (``train2017/NAME.jpg``, as detectron2's ``load_lvis_json``)."""
    if "file_name" in entry:
        return entry["file_name"]
    return "/".join(entry["coco_url"].split("/")[-2:])


def check_coco(split: CocoSplit) -> SplitReport:
    """Every image of the file (header, size against the entry) and every annotation (box,
    polygons, category, image id)."""
    report = SplitReport(split.where, f"{split.ann_file} with images in {split.image_dir}")
    report.files += 1
    try:
        with open(split.ann_file) as f:
            data = json.load(f)
        images, annotations, categories = data["images"], data.get("annotations", []), data["categories"]
    except FileNotFoundError:
        report.add("missing_annotation_file", split.ann_file)
        return report
    except (OSError, ValueError, KeyError, TypeError) as e:
        report.add("bad_annotation_file", f"{split.ann_file} ({type(e).__name__}: {e})")
        return report
    category_ids = {c["id"] for c in categories}
    by_id = {entry["id"]: entry for entry in images}
    annotated = set()
    for ann in annotations:
        label = f"annotation {ann.get('id')} of image {ann.get('image_id')}"
        image = by_id.get(ann.get("image_id"))
        if image is None:
            report.add("unknown_image_id", label)
            continue
        annotated.add(image["id"])
        label = f"{image_file_name(image)} (annotation {ann.get('id')})"
        if ann.get("category_id") not in category_ids:
            report.add("unknown_category", f"{label}: category_id {ann.get('category_id')}")
        if "bbox" in ann:
            defect = _box_defect(ann["bbox"], image["width"], image["height"])
            if defect:
                report.add(defect, f"{label}: bbox {ann['bbox']}")
        segmentation = ann.get("segmentation")
        if isinstance(segmentation, list) and any(len(poly) < 6 for poly in segmentation):
            report.add("short_polygon", label)
    for entry in images:
        name = image_file_name(entry)
        size = check_image(report, os.path.join(split.image_dir, name), name)
        if size is not None and size != (entry.get("width"), entry.get("height")):
            report.add("size_mismatch", f"{name} ({size[0]}x{size[1]}, annotated "
                                        f"{entry.get('width')}x{entry.get('height')})")
        if entry["id"] not in annotated:
            report.add("unannotated_image", name)
    return report


def coco_categories(ann_file: str) -> List[dict]:
    """The ``categories`` of a COCO-format file, in id order (the order detectron2's
    ``load_coco_json`` and mmdet's ``CocoDataset`` give them)."""
    with open(ann_file) as f:
        return sorted(json.load(f)["categories"], key=lambda c: c["id"])


def _walk(folder: str, suffix: str) -> List[str]:
    """The sorted paths below ``folder`` (relative to it) of its files ending in ``suffix``, without it."""
    return sorted(os.path.relpath(os.path.join(d, name), folder)[:-len(suffix)]
                  for d, _, files in os.walk(folder) for name in files if name.endswith(suffix))


def _label_values(image: Image.Image) -> List[int]:
    """The values present in a decoded label map: PIL's colour count for 8-bit maps (a few times
    faster than through numpy), numpy's unique values for 16- and 32-bit ones."""
    if image.mode in ("L", "P"):
        return sorted(value for _, value in image.getcolors(256))
    return np.unique(np.asarray(image)).tolist()


def check_seg(split: SegSplit) -> SplitReport:
    """Every image (header) and label map (decoded: size, channels, values) of the split."""
    report = SplitReport(split.where, f"images {split.image_dir}/*{split.img_suffix}, labels "
                                      f"{split.label_dir}/*{split.seg_map_suffix}, {split.num_classes} classes"
                                      + (", reduce_zero_label" if split.reduce_zero_label else ""))
    # reduce_zero_label (mmseg's LoadAnnotations): 0 -> ignore, v -> v - 1, 255 stays ignored
    valid = set(range(split.num_classes + 1)) | {255} if split.reduce_zero_label else \
        set(range(split.num_classes)) | {split.ignore_index}
    if split.split_file:
        with open(split.split_file) as f:
            stems = [line.strip() for line in f if line.strip()]
    else:
        stems = _walk(split.image_dir, split.img_suffix)
    for stem in stems:
        name = stem + split.img_suffix
        size = check_image(report, os.path.join(split.image_dir, name), name)
        label_name = stem + split.seg_map_suffix
        label_path = os.path.join(split.label_dir, label_name)
        if not os.path.isfile(label_path):
            report.add("missing_label", name)
            continue
        report.files += 1
        try:
            with Image.open(label_path) as image:
                mode, label_size = image.mode, image.size
                values = _label_values(image) if mode in ("L", "P", "I", "I;16") else None
        except (OSError, ValueError, SyntaxError):
            report.add("unreadable_label", label_name)
            continue
        if values is None:
            report.add("label_not_single_channel", f"{label_name} (mode {mode})")
            continue
        if size is not None and label_size != size:
            report.add("label_size_mismatch", f"{label_name} ({label_size[0]}x{label_size[1]}, image "
                                              f"{size[0]}x{size[1]})")
        bad = sorted(set(values) - valid)
        if bad:
            report.add("label_out_of_range", f"{label_name} (values {bad[:6]}{' ...' if len(bad) > 6 else ''})")
    if not split.split_file:
        for stem in sorted(set(_walk(split.label_dir, split.seg_map_suffix)) - set(stems)):
            report.add("label_without_image", stem + split.seg_map_suffix)
    return report


def check_splits(splits: Iterable) -> List[SplitReport]:
    """The report of every split (``CocoSplit`` or ``SegSplit``), each file read once."""
    return [check_coco(s) if isinstance(s, CocoSplit) else check_seg(s) for s in splits]


def add_coco_arguments(parser) -> None:
    """The tools' options for a COCO-format dataset of your own (detectron2, mmdet)."""
    parser.add_argument("--coco-train", nargs=2, metavar=("JSON", "IMAGES"),
                        help="train on this COCO-format file and image folder (the class names and every "
                             "head's num_classes follow its categories)")
    parser.add_argument("--coco-val", nargs=2, metavar=("JSON", "IMAGES"),
                        help="evaluate on this one (default: the training split)")


def add_segmentation_arguments(parser) -> None:
    """The tools' options for image and label-map folders of your own (mmseg)."""
    parser.add_argument("--seg-train", nargs=2, metavar=("IMAGES", "LABELS"),
                        help="train on these folders: images and label PNGs of the same stems")
    parser.add_argument("--seg-val", nargs=2, metavar=("IMAGES", "LABELS"),
                        help="validate and test on these (default: the training folders)")
    parser.add_argument("--classes", metavar="FILE",
                        help="the class list: a line 'NAME [R G B]' per label value, from 0 (with "
                             "--reduce-zero-label: from 1); the heads' num_classes follows it")
    parser.add_argument("--reduce-zero-label", action="store_true",
                        help="label 0 is 'unlabelled' (ignored), 1..N the classes (ADE20K's convention)")


def add_skip_argument(parser) -> None:
    """The training tools' option that skips the check."""
    parser.add_argument("--skip-data-check", action="store_true",
                        help="do not read every image header and annotation before training (tools/check_data.py "
                             "runs the same check alone)")


def run_check(splits: Iterable, skip_flag: str, log=print) -> List[SplitReport]:
    """What the tools run before building a model: every split checked and the reports logged.

    Args:
        splits: ``CocoSplit`` and ``SegSplit`` objects.
        skip_flag: the tool's option that skips the check, named in the error.
        log: where the reports (and their notes) go when there is no error.

    Raises:
        DataCheckError: a split has errors (the reports as message; a tool exits with status 1).
    """
    started = time.perf_counter()
    reports = check_splits(splits)
    text = "\n".join(r.format() for r in reports)
    errors = sum(KINDS[f.kind][0] == "error" for r in reports for f in r.findings)
    if errors:
        raise DataCheckError(f"data check: {errors} kinds of defects; nothing was trained.\n" + text
                             + f"\nFix the files as each 'fix' says and run again (tools/check_data.py CONFIG "
                               f"repeats only the check); {skip_flag} skips the check.")
    files = sum(r.files for r in reports)
    log(text + f"\ndata check: {files} files in {time.perf_counter() - started:.1f} s, no errors")
    return reports
