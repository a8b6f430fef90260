"""A timm classifier rebuilt from a checkpoint's ``meta``, and the one-forward check that it takes the
run's image size."""

from __future__ import annotations

from typing import Any, Mapping

import timm
import torch
from huggingface_hub.errors import HfHubHTTPError
from torch import nn

from ..checkpoint import CheckpointError
from ..engine.errors import ConfigError, model_arguments_checked

__all__ = ["build_classifier", "check_input_size", "pretrained_cfg"]


def pretrained_cfg(model_name: str) -> dict[str, Any]:
    """timm's pretrained config of ``model_name`` as a dict ({} if it has none)."""
    if not timm.is_model(model_name):
        raise ConfigError(f"unknown timm model {model_name!r}; list names with timm.list_models('*{model_name[:6]}*')")
    cfg = timm.models.get_pretrained_cfg(model_name)
    return cfg.to_dict() if cfg is not None else {}


def build_classifier(meta: Mapping[str, Any], pretrained: bool = False) -> nn.Module:
    """``timm.create_model`` from a checkpoint's ``meta``: a refused argument is a :class:`ConfigError`, pretrained
    weights that cannot be fetched a :class:`CheckpointError`."""
    name = meta["model"]
    if not timm.is_model(name):
        raise CheckpointError(f"unknown timm model {name!r}; check the name with timm.list_models('{name[:8]}*')")
    kwargs = dict(meta["model_kwargs"])
    for key, source in (("num_classes", "the classes of the data or checkpoint"), ("in_chans", "the data's images")):
        if kwargs.get(key, meta[key]) != meta[key]:
            raise ConfigError(f"--model-kwargs {key}={kwargs[key]}: {key} comes from {source} ({meta[key]} here), "
                              f"not from --model-kwargs; drop it from --model-kwargs")
        kwargs.pop(key, None)
    try:
        with model_arguments_checked(name, kwargs):
            return timm.create_model(name, pretrained=pretrained, num_classes=meta["num_classes"],
                                     in_chans=meta["in_chans"], **kwargs)
    except (HfHubHTTPError, OSError) as exc:
        if not pretrained:
            raise
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot get the pretrained weights of {name} ({type(exc).__name__}: {detail}); connect "
                              f"to the Hugging Face Hub (HF_HUB_OFFLINE unset), or pass the downloaded file with "
                              f"--checkpoint FILE") from exc


def _blank_forward(model: nn.Module, in_chans: int, size: int, device: torch.device) -> None:
    with torch.no_grad():
        model(torch.zeros(1, in_chans, size, size, device=device))


def check_input_size(model: nn.Module, meta: Mapping[str, Any], device: torch.device) -> None:
    """One eval-mode forward of a blank image, so a model that cannot take this size fails in one line (a
    RuntimeError only when the model runs at its pretrained size)."""
    was_training = model.training
    model.eval()
    size = meta["img_size"]
    try:
        _blank_forward(model, meta["in_chans"], size, device)
    except (ValueError, AssertionError, RuntimeError) as exc:
        if isinstance(exc, (torch.OutOfMemoryError, NotImplementedError)) or "can't allocate memory" in str(exc):
            raise
        if isinstance(exc, RuntimeError):
            reference = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))[-1]
            if reference == size:
                raise
            try:
                _blank_forward(model, meta["in_chans"], reference, device)
            except Exception:
                raise exc from None  # fails at its own size too: not a matter of the image size
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{meta['model']} cannot take {size} px images ({reason}); pass a larger --img-size or "
                          f"model kwargs that fit (e.g. a smaller patch_size)") from exc
    model.train(was_training)
