"""Checking a model name against timm's registry, with the closest names as a hint."""

from __future__ import annotations

import difflib

import timm

__all__ = ["unknown_timm_model"]


def unknown_timm_model(name: str) -> str | None:
    """Why ``name`` is not a timm model, with the closest names (WeightFormer's register on
    ``import weightformer``), as one line; None when it is one."""
    if timm.is_model(name):
        return None
    close = difflib.get_close_matches(name, timm.list_models(), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"model {name!r} is not a timm model; {hint}list names with timm.list_models('*vit*')"
