"""The model to export or run: a checkpoint of any format the engine reads, or a timm model's own weights.

Our training checkpoints (``last.pt``/``best.pt``) carry ``meta``, which rebuilds the model without
flags (:func:`weightformer.engine.state.build_model`); other files (the authors' releases, timm or
bare state dicts) need ``model`` to name the architecture. Weights always go through
:func:`weightformer.engine.state.load_weights`, the one loader.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from ..checkpoint import CheckpointError
from ..engine.state import build_model, load_weights, model_state_from, read_checkpoint

__all__ = ["LoadedModel", "load_classifier", "run_summary"]


@dataclass
class LoadedModel:
    """A classifier in eval mode, what rebuilds it (``meta``), and where it came from."""

    model: nn.Module
    meta: dict[str, Any]
    source: str
    checkpoint: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def img_size(self) -> int:
        """The side the model was trained (or pretrained) at."""
        if "img_size" in self.meta:
            return int(self.meta["img_size"])
        return int(self.model.pretrained_cfg.get("input_size", (3, 224, 224))[-1])


def _meta_without_checkpoint_meta(model: str, model_kwargs: Mapping[str, Any],
                                  state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``meta`` for a checkpoint that does not carry one: the architecture the user named, with the class
    and channel counts read off the weights' classifier and stem."""
    if not timm.is_model(model):
        raise CheckpointError(f"unknown timm model {model!r}; check the name with timm.list_models('{model[:8]}*')")
    cfg = timm.models.get_pretrained_cfg(model)
    cfg = cfg.to_dict() if cfg is not None else {}
    meta: dict[str, Any] = {"model": model, "model_kwargs": dict(model_kwargs),
                            "num_classes": cfg.get("num_classes") or 1000, "in_chans": 3}
    head = state.get(f"{cfg.get('classifier', 'head')}.weight")
    if head is not None and head.dim() == 2:
        meta["num_classes"] = head.shape[0]  # (classes, features)
    stem = state.get(f"{cfg.get('first_conv', 'patch_embed.proj')}.weight")
    if stem is not None and stem.dim() == 4:
        meta["in_chans"] = stem.shape[1]  # (out, in_chans, kh, kw)
    return meta


def load_classifier(
    checkpoint: str | None = None,
    model: str | None = None,
    pretrained: bool = False,
    model_kwargs: Mapping[str, Any] | None = None,
    use_ema: bool = False,
) -> LoadedModel:
    """The classifier in ``checkpoint`` (rebuilt from its ``meta``, or as ``model``), or timm's pretrained
    ``model``; in eval mode on the CPU. Raises :class:`CheckpointError` for what cannot be loaded."""
    model_kwargs = dict(model_kwargs or {})
    if checkpoint is None:
        if not (model and pretrained):
            raise CheckpointError("no model given; pass --checkpoint PATH, or --model NAME --pretrained")
        meta = _meta_without_checkpoint_meta(model, model_kwargs, {})
        net = build_model(meta, pretrained=True)
        return LoadedModel(net.eval(), meta, f"{model} (pretrained)")
    ckpt = read_checkpoint(checkpoint)
    meta = dict(ckpt.get("meta") or {})
    task = meta.get("task", "classification")
    if task != "classification":
        raise CheckpointError(f"{checkpoint} is a {task} checkpoint; these commands take image classifiers")
    if model is not None and meta.get("model") not in (None, model):
        meta = {}  # another architecture was asked for: the weights must fit it
    if not meta:
        if model is None:
            raise CheckpointError(f"{checkpoint} does not say which model it holds; pass --model NAME")
        meta = _meta_without_checkpoint_meta(model, model_kwargs, model_state_from(ckpt, use_ema, checkpoint))
    elif model_kwargs:
        meta["model_kwargs"] = {**meta["model_kwargs"], **model_kwargs}
    net = build_model(meta)
    load_weights(net, ckpt, use_ema=use_ema, source=checkpoint)
    return LoadedModel(net.eval(), meta, checkpoint, ckpt)


def run_summary(loaded: LoadedModel) -> dict[str, Any]:
    """What the model card says about the run: its best validation metrics (from the run folder's
    ``metrics.jsonl`` when it sits beside the checkpoint, else from the checkpoint) and its settings."""
    ckpt = loaded.checkpoint
    metrics = {k[len("val_"):]: v for k, v in ckpt.items() if k.startswith("val_")}
    epoch = ckpt.get("epoch")
    log = Path(loaded.source).parent / "metrics.jsonl" if ckpt else None
    if log is not None and log.is_file():
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        scored = [r for r in records if "val_top1" in r]
        if scored:
            best = max(scored, key=lambda r: r["val_top1"])
            metrics = {k[len("val_"):]: v for k, v in best.items() if k.startswith("val_")}
            epoch = best.get("epoch")
    return {"metrics": metrics, "epoch": epoch, "config": ckpt.get("config") or {}, "data": loaded.meta.get("data")}
