"""WeightFormer with every block dynamic and the ``double_centered`` (second-order, unit-scaled, border-free)
linear predictor: the long-range variant of docs/analysis.md, at T and S size."""

from typing import Any, Collection

from timm.models import generate_default_cfgs, register_model

from ..layers import long_range_predictors  # noqa: F401  (registers the double_centered predictor)
from .weightformer import WeightFormer, _cfg, _create_weightformer

__all__ = ["LONG_RANGE_ARGS", "name_unversioned_predictor", "weightformer_long_range_small",
           "weightformer_long_range_tiny"]

# What the long-range design changes against the released one, at every size.
LONG_RANGE_ARGS = {"linear_predictor": "double_centered", "dynamic_period": 1}

# The released T's and S's preprocessing; no weights exist for these variants.
default_cfgs = generate_default_cfgs({
    "weightformer_long_range_tiny": {**_cfg("", 224), "hf_hub_id": None},
    "weightformer_long_range_small": {**_cfg("", 224), "hf_hub_id": None},
})


def _create_long_range(name: str, pretrained: bool, args: dict, kwargs: dict) -> WeightFormer:
    if pretrained:
        raise ValueError(f"{name} has no pretrained weights; train it, or load a file with --init")
    return _create_weightformer(name, False, **{**args, **LONG_RANGE_ARGS, **kwargs})


@register_model
def weightformer_long_range_tiny(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-T with every block dynamic and the ``double_centered`` linear predictor (layers/long_range_predictors.py).

    Why: the released ``bilateral`` predictor's ΔW is tiny against the static weight and a plain mean over
    tokens, so a few informative tokens cannot set it. ``double_centered`` predicts ΔW from the covariance of
    the tokens' projections, double-centred on the pooled grid (the background's constant part and the
    convolutions' zero-padded border removed), at unit scale with a learned gain. docs/analysis.md has the
    probes it was chosen on and their measured results.

    Cost: 10.12M parameters against the released T's 7.07M; 2.63 GFLOPs at 224² (+17%) and
    66.5 at 1248² (+3.4%), as with ``centered``: the double centring adds about 4·N'·(C/r + O/r)
    element-wise operations per dynamic block (0.8 MFLOPs at 224², 25 at 1248², which the FLOP counter
    does not count). The dynamic layers' extra work is per token, so it stays O(N).
    """
    return _create_long_range("weightformer_long_range_tiny", pretrained, {"patch_size": 16, "embed_dim": 192,
                                                                         "depth": 17}, kwargs)


@register_model
def weightformer_long_range_small(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-S with every block dynamic and the ``double_centered`` linear predictor: the long-range
    design of :func:`weightformer_long_range_tiny` (the reason is in its docstring) at 384-d.

    Cost: 39.68M parameters against the released S's 27.49M; 12.31 GFLOPs at 224² (+29% over the
    released S's 9.52) and 263.7 at 1248² (+3.9% over 253.7; DeiT-S: 944.5). The dynamic layers'
    extra work per token grows with the width, hence the larger share at 224² than T's.
    """
    return _create_long_range("weightformer_long_range_small", pretrained, {"patch_size": 16, "embed_dim": 384,
                                                                          "depth": 17}, kwargs)


def name_unversioned_predictor(checkpoint: dict[str, Any],
                               designs: Collection[str] = tuple(default_cfgs)) -> dict[str, Any]:
    """A checkpoint of format 0, upgraded (a task's upgrade step): a long-range design in ``designs`` whose
    kwargs name no ``linear_predictor`` was trained with ``centered``, the design's predictor before runs
    wrote theirs down, so its meta and config name it."""
    meta = checkpoint["meta"]
    if meta.get("model") not in designs or "linear_predictor" in (meta.get("model_kwargs") or {}):
        return checkpoint
    named = {k: {**part, "model_kwargs": {**(part.get("model_kwargs") or {}), "linear_predictor": "centered"}}
             for k, part in checkpoint.items() if k in ("meta", "config") and isinstance(part, dict)}
    return {**checkpoint, **named}
