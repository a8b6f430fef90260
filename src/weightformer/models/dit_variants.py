"""The named WeightFormer-DiT and DiT sizes, registered with timm (``timm.create_model("wf_dit_s_2")``).

- ``wf_dit_{s,b}_{2,4,8}``: the release's WF-DiT-S and -B, depth 15 (deeper than DiT's 12 to match its
  parameters: a WeightFormer block has no 4C² attention projections); ``wf_dit_{l,xl}_*``: DiT-L and -XL
  widths at depths 30 and 35 (DiT's 24 and 28 times 15/12), not released.
- ``wf_dit_long_range_*``: WF-DiT with the classifier's long-range design (``LONG_RANGE_ARGS`` of
  models/weightformer_long_range.py), not released; ``dit_*``: the attention DiT baseline, DiT's configs.

Keyword arguments (``input_size``, ``in_channels``, ``num_classes``, ...) pass to :class:`WeightFormerDiT`.
"""

from __future__ import annotations

from typing import Any

from timm.models import register_model

from .dit import WeightFormerDiT
from .weightformer_long_range import LONG_RANGE_ARGS

__all__ = ["DIT_VARIANTS", "LONG_RANGE_VARIANTS", "create_dit", "variant_name"]

# size -> (hidden_size, WeightFormer depth, attention depth, attention heads)
_SIZES = {"s": (384, 15, 12, 6), "b": (768, 15, 12, 12), "l": (1024, 30, 24, 16), "xl": (1152, 35, 28, 16)}
_PATCHES = (2, 4, 8)


def _arguments(design: str, size: str, patch: int) -> dict[str, Any]:
    hidden, wf_depth, attn_depth, heads = _SIZES[size]
    if design == "attention":
        return dict(hidden_size=hidden, depth=attn_depth, patch_size=patch, mixer="attention", num_heads=heads)
    long_range = LONG_RANGE_ARGS if design == "long_range" else {}
    return dict(hidden_size=hidden, depth=wf_depth, patch_size=patch, mixer="weightformer", **long_range)


DIT_VARIANTS: dict[str, dict[str, Any]] = {
    f"{prefix}_{size}_{patch}": _arguments(design, size, patch)
    for prefix, design in (("wf_dit", "released"), ("wf_dit_long_range", "long_range"), ("dit", "attention"))
    for size in _SIZES for patch in _PATCHES
}

# A released WF-DiT -> its long-range design at the same size and patch.
LONG_RANGE_VARIANTS = {f"wf_dit_{size}_{patch}": f"wf_dit_long_range_{size}_{patch}" for size in _SIZES for patch in _PATCHES}


def variant_name(paper_name: str) -> str:
    """``"WF-DiT-S/2"`` or ``"DiT-XL/2"`` -> ``"wf_dit_s_2"`` / ``"dit_xl_2"``."""
    return paper_name.lower().replace("-", "_").replace("/", "_")


def create_dit(name: str, **kwargs: Any) -> WeightFormerDiT:
    """The variant ``name`` (a key of :data:`DIT_VARIANTS`), with ``kwargs`` overriding its arguments."""
    if name not in DIT_VARIANTS:
        raise ValueError(f"unknown diffusion model {name!r}; choose one of {', '.join(DIT_VARIANTS)}")
    return WeightFormerDiT(**{**DIT_VARIANTS[name], **kwargs})


def _register(name: str) -> None:
    def entrypoint(pretrained: bool = False, **kwargs: Any) -> WeightFormerDiT:
        if pretrained:
            raise ValueError(f"{name} has no pretrained weights in timm; load a checkpoint instead")
        for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):
            kwargs.pop(key, None)
        return create_dit(name, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__doc__ = f"{name}: see weightformer.models.dit_variants."
    register_model(entrypoint)


for _name in DIT_VARIANTS:
    _register(_name)
