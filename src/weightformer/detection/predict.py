"""``weightformer det predict``: a checkpoint's detections on image files, drawn and listed in ``detections.json``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torchvision.transforms.functional import pil_to_tensor

from ..data.images import image_paths, read_image
from ..engine.device import pick_device
from ..engine.errors import ConfigError, NonFiniteError
from ..engine.metrics import json_text
from ..engine.outputs import claim_outputs, write_atomic
from ..engine.run_dir import check_writable_folder
from ..engine.weights import load_model
from .visualize import draw_detections

__all__ = ["DETECTIONS_FILE", "predict"]

DETECTIONS_FILE = "detections.json"


def _drawn_path(out: Path, index: int, image: Path) -> Path:
    return out / f"{index:04d}_{image.stem}.png"  # the index keeps same-named images of different folders apart


@torch.no_grad()
def predict(checkpoint: str | os.PathLike, images: Sequence[str | os.PathLike], out: Optional[str | os.PathLike] = None,
            score_threshold: float = 0.5, use_ema: bool = False, device: str = "auto",
            overwrite: bool = False) -> list[dict[str, Any]]:
    """The detections scoring at least ``score_threshold`` on each of ``images`` (files, or folders of them):
    one record per image, ``{"image", "detections": [{"label", "score", "box_xyxy"}, ...]}`` (in the image's
    pixels). With ``out``, each image is also drawn into ``out/<index>_<name>.png`` (the record's ``"drawn"``)
    and the records written to ``out/detections.json``; files already there are moved aside only with
    ``overwrite``. Every image is read before the model is loaded."""
    if not 0.0 <= score_threshold <= 1.0:
        raise ConfigError(f"--score-threshold must be in [0, 1], got {score_threshold}")
    files = image_paths(images)
    folder = Path(out) if out is not None else None
    if folder is not None:  # before the work; no output may replace an input image
        check_writable_folder(folder, "--out")
        outputs = [folder / DETECTIONS_FILE, *(_drawn_path(folder, i, f) for i, f in enumerate(files))]
        claim_outputs(outputs, overwrite, "weightformer det predict", inputs=files)
    pixels = [pil_to_tensor(read_image(path)).float() / 255 for path in files]  # (3, H, W) RGB in [0, 1]
    where = pick_device(device)
    loaded = load_model(checkpoint, task="detection", use_ema=use_ema, device=where)
    names = ["__background__", *loaded.meta["classes"]]
    records = []
    for index, (path, image) in enumerate(zip(files, pixels)):
        prediction = {k: v.cpu() for k, v in loaded.model([image.to(where)])[0].items()}
        if not all(v.isfinite().all() for v in prediction.values() if v.is_floating_point()):
            raise NonFiniteError(f"the model gave non-finite detections (NaN or Inf) for {path}; no result is given from them")
        record: dict[str, Any] = {"image": str(path)}
        if folder is not None:
            drawn = _drawn_path(folder, index, path)
            picture = draw_detections(image, prediction, names, score_threshold)
            write_atomic(drawn, lambda f: picture.save(f, format="PNG"))
            record["drawn"] = str(drawn)
        keep = prediction["scores"] >= score_threshold
        kept = zip(prediction["boxes"][keep], prediction["labels"][keep], prediction["scores"][keep])
        record["detections"] = [{"label": names[int(label)], "score": round(float(score), 4),
                                 "box_xyxy": [round(float(v), 2) for v in box]} for box, label, score in kept]
        records.append(record)
    if folder is not None:
        write_atomic(folder / DETECTIONS_FILE, json_text(records, indent=2) + "\n")
    return records
