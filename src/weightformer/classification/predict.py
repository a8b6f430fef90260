"""Prediction: the top-k classes of image files, or of every image in folders (``weightformer predict``),
preprocessed as the model is evaluated; unreadable files are skipped and listed (exit :data:`EXIT_SKIPPED`).
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from timm.data import ImageNetInfo, create_transform, infer_imagenet_subset
from torch.utils.data import DataLoader, Dataset

from ..data.folder import DECODE_ERRORS, rgb_loader
from ..data.images import image_paths
from ..engine.device import autocast
from ..engine.errors import NonFiniteError
from ..engine.metrics import json_text
from ..engine.weights import LoadedModel
from ..engine.outputs import output_file
from ..progress import progress
from .evaluate import eval_transform_config
from .model import check_input_size

__all__ = ["EXIT_SKIPPED", "Predictions", "class_names", "predict", "write_predictions"]

EXIT_SKIPPED = 3  # every readable image was predicted, and some files were not images that could be read


def class_names(loaded: LoadedModel) -> list[str]:
    """A name per class: the checkpoint's, the model's ``label_names``, ImageNet's descriptions, else ``class <i>``."""
    model, num_classes = loaded.model, loaded.model.num_classes
    if loaded.meta.get("classes") and len(loaded.meta["classes"]) == num_classes:
        return [str(c) for c in loaded.meta["classes"]]
    labels = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if labels and len(labels) == num_classes:
        return [str(c) for c in (labels.values() if isinstance(labels, dict) else labels)]
    subset = infer_imagenet_subset(model)
    if subset:
        info = ImageNetInfo(subset)
        return [info.index_to_description(i) for i in range(num_classes)]
    return [f"class {i}" for i in range(num_classes)]


class ImageFiles(Dataset):
    """(transformed image, index, readable) per file; an unreadable file gives an empty image and False."""

    def __init__(self, files: Sequence[Path], transform: Any, in_chans: int):
        self.files, self.transform, self.in_chans = list(files), transform, in_chans

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, bool]:
        try:
            image = rgb_loader(str(self.files[index]))
            image.load()
        except DECODE_ERRORS:
            return torch.empty(0), index, False
        if self.in_chans == 1:
            image = image.convert("L")
        return self.transform(image), index, True


def _collate(batch: list[tuple[torch.Tensor, int, bool]]) -> tuple[torch.Tensor, list[int], list[int]]:
    """(the readable images stacked (B, C, H, W), their indices, the unreadable files' indices)."""
    good = [(img, i) for img, i, ok in batch if ok]
    images = torch.stack([img for img, _ in good]) if good else torch.empty(0)
    return images, [i for _, i in good], [i for _, i, ok in batch if not ok]


@dataclass
class Predictions:
    """Top-k per readable image (path, [(class index, name, probability), ...]), the skipped files, time."""

    rows: list[tuple[str, list[tuple[int, str, float]]]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


@torch.no_grad()
def predict(loaded: LoadedModel, files: str | os.PathLike | Sequence[str | os.PathLike], top_k: int = 5,
            batch_size: int = 32, img_size: int | None = None, workers: int = 0, device: str | torch.device = "cpu",
            amp: str = "none") -> Predictions:
    """Top-``top_k`` softmax probabilities of ``loaded``'s classes for each of ``files`` (an image, or several;
    a folder: the images under it), in order; the forward pass under ``amp`` (none, bf16, fp16) autocast."""
    device = torch.device(device)
    autocast(device, amp)  # an --amp the device cannot run is refused before any image is read
    files = image_paths(files)
    model = loaded.model.to(device).eval()
    names = class_names(loaded)
    data_config = eval_transform_config(model, loaded.meta, img_size)
    # An image size the model cannot take (smaller than one patch, say) is one line, before any image is read.
    check_input_size(model, {"model": loaded.meta["model"], "in_chans": loaded.meta["in_chans"],
                             "img_size": data_config["input_size"][-1]}, device)
    transform = create_transform(**data_config, is_training=False)
    loader = DataLoader(ImageFiles(files, transform, loaded.meta["in_chans"]), batch_size=batch_size,
                        num_workers=workers, collate_fn=_collate)
    out = Predictions()
    start = time.perf_counter()
    k = min(top_k, len(names))
    with progress(total=len(files), desc="predicting", unit="img") as bar:
        for images, indices, unreadable in loader:
            out.skipped.extend(str(files[i]) for i in unreadable)
            if indices:
                with autocast(device, amp):
                    logits = model(images.to(device))
                logits = logits.float()  # (B, classes)
                bad = [str(files[i]) for i, ok in zip(indices, logits.isfinite().all(1).tolist()) if not ok]
                if bad:
                    raise NonFiniteError(f"the model gave non-finite logits (NaN or Inf) for {len(bad)} image(s) of "
                                         f"a batch, such as {bad[0]}; no prediction is given from them")
                probs = logits.softmax(dim=-1)
                top_p, top_i = probs.topk(k, dim=-1)
                for i, p_row, c_row in zip(indices, top_p.tolist(), top_i.tolist()):
                    out.rows.append((str(files[i]), [(c, names[c], p) for c, p in zip(c_row, p_row)]))
            bar.update(len(indices) + len(unreadable))
    out.seconds = time.perf_counter() - start
    return out


def write_predictions(result: Predictions, path: Path, overwrite: bool = False) -> None:
    """``path`` as CSV (path, rank, class_index, label, probability) or JSON, by its suffix; atomically."""
    if path.suffix.lower() == ".csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(["path", "rank", "class_index", "label", "probability"])
        for file, top in result.rows:
            writer.writerows([file, rank, c, name, f"{p:.6f}"] for rank, (c, name, p) in enumerate(top, 1))
        text = buffer.getvalue()
    else:
        records = [{"path": file, "top": [{"class_index": c, "label": name, "probability": p} for c, name, p in top]}
                   for file, top in result.rows]
        text = json_text({"predictions": records, "skipped": result.skipped}, indent=2) + "\n"
    with output_file(path, overwrite) as tmp:
        tmp.write_text(text, encoding="utf-8")
