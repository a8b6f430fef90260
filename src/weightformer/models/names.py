"""Checking a model name against timm's registry, with the closest names as a hint."""

from __future__ import annotations

import difflib

import timm

from ..engine.errors import ConfigError

__all__ = ["check_timm_model"]


def check_timm_model(name: str) -> None:
    """ConfigError unless ``name`` is a timm model (WeightFormer's register on ``import weightformer``)."""
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ConfigError(f"model {name!r} is not a timm model; {hint}list names with timm.list_models('*vit*')")
