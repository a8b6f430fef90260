"""What the exports need to know about a loaded classifier beyond the model: its trained side and its run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..engine.metrics import read_metrics
from ..engine.weights import LoadedModel

__all__ = ["run_summary", "trained_size"]


def trained_size(loaded: LoadedModel) -> int:
    """The side the model was trained (or pretrained) at."""
    if "img_size" in loaded.meta:
        return int(loaded.meta["img_size"])
    return int(loaded.model.pretrained_cfg.get("input_size", (3, 224, 224))[-1])


def run_summary(loaded: LoadedModel) -> dict[str, Any]:
    """The run's best validation metrics (from ``metrics.jsonl`` beside the checkpoint, else the checkpoint's)
    and settings, for the model card."""
    ckpt = loaded.checkpoint
    metrics = {k[len("val_"):]: v for k, v in ckpt.items() if k.startswith("val_")}
    epoch = ckpt.get("epoch")
    log = Path(loaded.source).parent / "metrics.jsonl" if ckpt else None
    if log is not None and log.is_file():
        records = read_metrics(log)
        scored = [r for r in records if "val_top1" in r]
        if scored:
            best = max(scored, key=lambda r: r["val_top1"])
            metrics = {k[len("val_"):]: v for k, v in best.items() if k.startswith("val_")}
            epoch = best.get("epoch")
    return {"metrics": metrics, "epoch": epoch, "config": ckpt.get("config") or {}, "data": loaded.meta.get("data")}
