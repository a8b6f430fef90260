"""``seg predict``: class maps as palette PNGs in the data set's annotation encoding (class c stored as c + 1
with reduce-zero-label, as ADE20K does), so a prediction opens like an annotation, and colour overlays."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from PIL import Image
from torch import nn

from ..data.errors import DataError
from ..data.images import image_paths, read_image
from ..engine.errors import ConfigError
from ..engine.outputs import claim_outputs, write_atomic
from ..progress import progress
from ..engine.run_dir import check_writable_folder
from .data import EvalTransform
from .evaluation import eval_transform, load_segmenter
from .inference import infer
from .synthetic import SHAPES_CLASSES

__all__ = ["image_files", "palette", "predict", "predict_image", "write_prediction"]

SHAPES_COLOURS = ((90, 90, 90), (230, 60, 50), (60, 200, 80), (60, 110, 240))  # background, circle, square, triangle


def palette(num_classes: int, classes: Optional[Sequence[str]] = None) -> np.ndarray:
    """(num_classes, 3) uint8 colours: fixed ones for the shapes set, else drawn from a fixed seed."""
    if classes is not None and tuple(classes) == SHAPES_CLASSES:
        return np.array(SHAPES_COLOURS, dtype=np.uint8)
    return np.random.default_rng(0).integers(0, 256, (num_classes, 3), dtype=np.uint8)


def image_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The image files named (a folder: those under it), each with its own name, as predictions take it."""
    files = image_paths(paths)
    twice = sorted(stem for stem, count in Counter(p.stem for p in files).items() if count > 1)
    if twice:
        raise DataError(f"several images are named {twice[0]} (in different folders or formats); their predictions "
                        f"would overwrite each other: predict them into different --out folders")
    return files


@torch.no_grad()
def predict_image(model: nn.Module, image: Image.Image, transform: EvalTransform, device: torch.device,
                  mode: str = "whole", crop: int = 512, stride: int = 341) -> np.ndarray:
    """(H, W) int64 classes of an RGB ``image``: resized as in evaluation, predicted, logits resized back."""
    pixels = TF.pil_to_tensor(image)  # (3, H, W) uint8
    resized, _ = transform(pixels, torch.empty(0))  # (3, h, w) normalised; the label is unused
    logits = infer(model, resized[None].to(device), mode, crop, stride)
    logits = F.interpolate(logits, size=pixels.shape[-2:], mode="bilinear", align_corners=False)  # (1, K, H, W)
    return logits.argmax(1)[0].cpu().numpy()


def write_prediction(stem: str, image: Image.Image, classes: np.ndarray, colours: np.ndarray, out: Path,
                     reduce_zero_label: bool, alpha: float = 0.5) -> tuple[Path, Path]:
    """Write ``<out>/<stem>.png`` (the (H, W) ``classes`` as a palette PNG) and ``<out>/<stem>_overlay.png``."""
    offset = int(reduce_zero_label)  # index 0 of the file is "unlabelled" with reduce-zero-label
    file_colours = np.zeros((256, 3), dtype=np.uint8)
    file_colours[offset: offset + len(colours)] = colours
    label = Image.fromarray((classes + offset).astype(np.uint8))  # (H, W) uint8: mode L, P once it has a palette
    label.putpalette(file_colours.flatten().tolist())
    blend = (1 - alpha) * np.asarray(image, dtype=np.float64) + alpha * colours[classes].astype(np.float64)
    label_path, overlay_path = out / f"{stem}.png", out / f"{stem}_overlay.png"
    overlay = Image.fromarray(np.clip(blend + 0.5, 0, 255).astype(np.uint8))
    for picture, path in ((label, label_path), (overlay, overlay_path)):
        write_atomic(path, lambda f: picture.save(f, format="PNG"))
    return label_path, overlay_path


def predict(checkpoint: str | os.PathLike, images: Sequence[str | os.PathLike], out: str | os.PathLike,
            use_ema: bool = False, inference: Optional[str] = None, crop: Optional[int] = None,
            stride: Optional[int] = None, alpha: float = 0.5, device: str = "auto", overwrite: bool = False
            ) -> list[tuple[Path, Path, Path]]:
    """``seg predict``: ``<out>/<name>.png`` and ``<name>_overlay.png`` (opacity ``alpha``) of each of ``images``
    (files or folders), outputs already there refused or moved aside (``overwrite``); (image, map, overlay)s."""
    if not 0 <= alpha <= 1:
        raise ConfigError(f"--alpha must be in [0, 1], got {alpha}")
    out = Path(out)
    check_writable_folder(out, "--out")
    files = image_files(images)
    outputs = [out / f"{path.stem}{end}" for path in files for end in (".png", "_overlay.png")]
    claim_outputs(outputs, overwrite, "weightformer seg predict", inputs=files)
    loaded, settings = load_segmenter(checkpoint, use_ema, device, inference, crop, stride)
    meta, target = loaded.meta, next(loaded.model.parameters()).device
    transform = eval_transform(meta["img_size"])
    colours = palette(meta["num_classes"], meta.get("classes"))
    written = []
    for path in progress(files, desc="predicting", unit="img"):
        image = read_image(path)
        classes = predict_image(loaded.model, image, transform, target, settings["seg_inference"],
                                settings["seg_crop"], settings["seg_stride"])
        written.append((path, *write_prediction(path.stem, image, classes, colours, out, meta["reduce_zero_label"],
                                                alpha)))
    return written
