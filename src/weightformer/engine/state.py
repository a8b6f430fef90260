"""What a checkpoint holds, and how a model is rebuilt from it.

A training checkpoint is a dict of tensors and plain Python values only, so it loads with
``torch.load(weights_only=True)``:

    model, ema            state dicts (ema is None without --ema)
    optimizer, scheduler, scaler
    epoch, step_in_epoch, global_step   where the run stands: epoch index, optimizer steps taken
                                        in it, optimizer steps in total
    progress              running sums of the current epoch (loss, samples, seconds) and the best result
    rng                   per-rank generator states (torch, cuda, numpy, python)
    meta                  what rebuilds the model without flags: timm name, kwargs, classes, data, transforms
    config                the resolved TrainConfig as a dict
"""

from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import timm
import torch
from torch import nn

from ..checkpoint import CheckpointError, load_checkpoint_file, strip_wrapper_prefixes
from .errors import ConfigError

__all__ = [
    "build_model",
    "capture_rng",
    "load_model_state",
    "model_state_from",
    "read_checkpoint",
    "restore_rng",
]


def capture_rng() -> dict[str, Any]:
    """This process's torch, CUDA, NumPy and Python generator states, as tensors and plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def build_model(meta: Mapping[str, Any], pretrained: bool = False) -> nn.Module:
    """``timm.create_model`` from a checkpoint's ``meta`` (name, kwargs, classes, channels)."""
    name = meta["model"]
    if not timm.is_model(name):
        raise CheckpointError(f"unknown timm model {name!r}; check the name with timm.list_models('{name[:8]}*')")
    kwargs = meta["model_kwargs"]
    try:
        return timm.create_model(
            name, pretrained=pretrained, num_classes=meta["num_classes"], in_chans=meta["in_chans"], **kwargs
        )
    except (TypeError, ValueError, AssertionError) as exc:  # a bad model argument, as the model reports it
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot build {name} with model arguments {kwargs}: {detail}; check --model-kwargs"
        ) from exc


def read_checkpoint(path: str) -> dict[str, Any]:
    """Load a checkpoint without running pickled code (safetensors, or ``torch.load(weights_only=True)``)."""
    obj = load_checkpoint_file(path)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a dict of weights")
    return obj


def model_state_from(checkpoint: Mapping[str, Any], use_ema: bool = False, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The model weights in a checkpoint: ours (``model``/``ema``), timm/DeiT style, or a bare state dict."""
    if use_ema:
        if checkpoint.get("ema") is None:
            raise CheckpointError(f"{source} has no EMA weights (the run did not use --ema); drop --ema")
        return dict(checkpoint["ema"])
    for key in ("model", "state_dict", "model_ema"):
        if isinstance(checkpoint.get(key), Mapping):
            return dict(checkpoint[key])
    return dict(checkpoint)


def load_model_state(model: nn.Module, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy ``state`` into ``model``, or raise :class:`CheckpointError` naming what does not match.

    A classifier of another size is reported as a class-count mismatch; other differences list
    the first missing, unexpected and differently shaped keys.
    """
    state = strip_wrapper_prefixes(state)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    reshaped = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if not (missing or unexpected or reshaped):
        model.load_state_dict(state)
        return
    classifier = getattr(model, "pretrained_cfg", {}).get("classifier", "head")
    head_weight = f"{classifier}.weight"
    only_head = all(k.startswith(f"{classifier}.") for k in reshaped)
    if head_weight in reshaped and only_head and not (missing or unexpected):
        raise CheckpointError(
            f"{source} has {state[head_weight].shape[0]} classes, the model has {expected[head_weight].shape[0]}; "
            f"use a checkpoint trained on this data set, or data with the checkpoint's classes"
        )
    details = []
    if reshaped:
        shapes = ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}" for k in reshaped[:3])
        details.append(f"{len(reshaped)} shape mismatch(es) (checkpoint vs model): {shapes}")
    if missing:
        details.append(f"{len(missing)} weight(s) missing from it, e.g. {', '.join(missing[:3])}")
    if unexpected:
        details.append(f"{len(unexpected)} weight(s) the model lacks, e.g. {', '.join(unexpected[:3])}")
    raise CheckpointError(
        f"{source} does not fit the model ({model.__class__.__name__}): {'; '.join(details)}. "
        f"It was saved for another architecture or configuration; pass the matching --model and --model-kwargs"
    )

