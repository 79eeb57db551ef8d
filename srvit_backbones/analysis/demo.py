"""tools/demo.py's loop (``run_demo``) over a framework's ``Demo`` (``FrameworkAdapter.build_demo``),
and the checks every framework's demo shares: the checkpoint read, CUDA and ``--amp``."""
import contextlib
import json
import os
from typing import Any, List, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from ..checkpoint import read_checkpoint
from ..errors import CheckpointError, ConfigError, InputError
from ..training.amp import amp_dtype


class Demo:
    """What ``run_demo`` asks of a framework's predictor. ``--save-raw`` writes, by ``raw_output``,
    ``"records"``: ``predictions.json`` of every image's ``records(prediction, image_id, file_name)``;
    ``"label_maps"``: ``labels/NAME.png`` of each image's ``label_map(prediction)``."""

    raw_output = "records"

    def predict(self, path: str) -> Tuple[np.ndarray, Any]:
        """(the image with its prediction drawn: RGB uint8 (H, W, 3), the prediction)."""
        raise NotImplementedError

    def is_empty(self, prediction) -> bool:
        """Whether nothing of ``prediction`` was drawn."""
        return False

    def empty_message(self) -> str:
        """What a picture with nothing drawn says."""
        return ""


class DetectionDemo(Demo):
    """A detector's demo: the instances scoring above ``score_threshold``."""

    score_threshold = 0.5

    def is_empty(self, prediction) -> bool:
        return len(prediction) == 0

    def empty_message(self) -> str:
        return f"no detection scores above {self.score_threshold:g}: lower --score-threshold to see weaker ones"


def say_on_image(image: np.ndarray, text: str) -> np.ndarray:
    """``image`` (RGB) with ``text`` wrapped in white on a black band across its top."""
    from PIL import ImageDraw, ImageFont

    picture = Image.fromarray(image)
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default(size=max(10, picture.width // 40))
    lines = [""]
    for word in text.split():
        candidate = f"{lines[-1]} {word}".strip()
        if lines[-1] and draw.textlength(candidate, font=font) > picture.width - 8:
            lines.append(word)
        else:
            lines[-1] = candidate
    text = "\n".join(lines)
    bottom = draw.multiline_textbbox((4, 4), text, font=font)[3]
    draw.rectangle((0, 0, picture.width, bottom + 4), fill=(0, 0, 0))
    draw.multiline_text((4, 4), text, fill=(255, 255, 255), font=font)
    return np.asarray(picture)


def relative_names(paths: Sequence[str]) -> List[str]:
    """Each image's path below the images' common folder (its picture's name, as .png).

    Raises:
        InputError: two images would be drawn to one file."""
    root = os.path.commonpath([os.path.dirname(p) for p in paths])
    names = [os.path.relpath(p, root) for p in paths]
    seen = {}
    for path, name in zip(paths, names):
        out = os.path.splitext(name)[0] + ".png"
        if out in seen:
            raise InputError(f"{seen[out]} and {path} would both be drawn to {out}: give them separately")
        seen[out] = path
    return names


def check_device(device: str, amp: bool) -> None:
    """Raises:
        ConfigError: ``device`` is CUDA and no GPU is visible, or ``amp`` where the device has none."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}, but no CUDA GPU is visible: run with --device cpu")
    if amp:
        try:
            amp_dtype(device)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def read_weights(checkpoint: str, key: str, framework: str, hint: str):
    """(checkpoint object, its weights under ``key``), read safely.

    Raises:
        CheckpointError: the file is no ``framework`` checkpoint; says why and, with ``hint``, where one comes from."""
    if not os.path.isfile(checkpoint):
        raise CheckpointError(f"--checkpoint {checkpoint!r} does not exist. Fix: {hint}")
    try:
        obj = read_checkpoint(checkpoint)
    except CheckpointError as e:
        raise CheckpointError(f"--checkpoint: {e}") from None
    weights = obj.get(key, obj) if isinstance(obj, dict) else obj
    if not (isinstance(weights, dict) and weights and all(torch.is_tensor(v) for v in weights.values())):
        held = ", ".join(map(str, list(obj)[:6])) if isinstance(obj, dict) else type(obj).__name__
        raise CheckpointError(f"--checkpoint {checkpoint} holds no {framework} weights (nothing under {key!r}; "
                              f"it holds {held}). Fix: {hint}")
    return obj, weights


@contextlib.contextmanager
def refused_unless_it_fits(hint: str):
    """``require_fit``'s CheckpointError with ``hint``, where a checkpoint that fits comes from."""
    try:
        yield
    except CheckpointError as e:
        raise CheckpointError(f"--checkpoint {e}\nFix: {hint}") from None


def run_demo(demo: Demo, paths: Sequence[str], names: Sequence[str], output: str,
             save_raw: bool = False) -> Tuple[List[str], List[str], List[str]]:
    """Draw ``demo``'s prediction on every image of ``paths`` to ``output/NAME.png`` (``names``:
    ``relative_names(paths)``); with ``save_raw``, the predictions as ``demo.raw_output`` says (the
    image's index in ``paths`` is its image_id). Returns (pictures, raw files, names with nothing drawn)."""
    from tqdm import tqdm

    records = demo.raw_output == "records"
    drawn, raw, results, empty = [], [], [], []
    for image_id, (path, name) in enumerate(tqdm(list(zip(paths, names)), desc="demo", unit="image")):
        drawn_image, prediction = demo.predict(path)
        if demo.is_empty(prediction):  # a picture with nothing drawn says why
            drawn_image = say_on_image(drawn_image, demo.empty_message())
            empty.append(name)
        png = os.path.splitext(name)[0] + ".png"
        out = os.path.join(output, png)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        Image.fromarray(drawn_image).save(out)
        drawn.append(out)
        if save_raw and records:
            results += demo.records(prediction, image_id, name)
        elif save_raw:
            labels = demo.label_map(prediction)
            label_file = os.path.join(output, "labels", png)
            os.makedirs(os.path.dirname(label_file), exist_ok=True)
            Image.fromarray(labels.astype(np.uint8 if labels.max(initial=0) < 256 else np.uint16)).save(label_file)
            raw.append(label_file)
    if save_raw and records:
        raw.append(os.path.join(output, "predictions.json"))
        with open(raw[0], "w") as f:
            json.dump(results, f)
    return drawn, raw, empty
