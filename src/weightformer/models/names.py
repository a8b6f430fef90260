"""Checking a model name against timm's registry, with the closest names as a hint; and the long-range
design's name for a released classifier backbone."""

from __future__ import annotations

import difflib

import timm

__all__ = ["LONG_RANGE_DESIGNS", "long_range_design", "unknown_timm_model"]

# A released backbone -> its long-range design (models/weightformer_long_range.py): the same size with
# the ``double_centered`` linear predictor in every block.
LONG_RANGE_DESIGNS = {"weightformer_tiny": "weightformer_long_range_tiny",
                      "weightformer_small": "weightformer_long_range_small"}


def unknown_timm_model(name: str) -> str | None:
    """Why ``name`` is not a timm model, with the closest names (WeightFormer's register on
    ``import weightformer``), as one line; None when it is one."""
    if timm.is_model(name):
        return None
    close = difflib.get_close_matches(name, timm.list_models(), n=3)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    return f"model {name!r} is not a timm model; {hint}list names with timm.list_models('*vit*')"


def long_range_design(name: str, designs: dict[str, str] = LONG_RANGE_DESIGNS) -> str | None:
    """The long-range design of model ``name`` in ``designs`` (released -> long-range): ``name`` itself
    when it is one, None when it has none."""
    if name in designs.values():
        return name
    return designs.get(name)
