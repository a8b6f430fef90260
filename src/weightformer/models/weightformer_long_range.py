"""WeightFormer with every block dynamic and the ``double_centered`` (second-order, unit-scaled, border-free)
linear predictor: the long-range variant of docs/analysis.md, at T and S size."""

from typing import Any, Collection

from timm.models import generate_default_cfgs, register_model

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
    """WeightFormer-T with every block dynamic and the ``double_centered`` linear predictor
    (layers/long_range_predictors.py): ΔW from the covariance of the tokens' projections, double-centred on the
    pooled grid, at unit scale with a learned gain, so that a few informative tokens can set it (the released
    ``bilateral`` ΔW is a plain mean over tokens). docs/analysis.md has the probes and results.

    10.12M parameters (released T: 7.07M); 2.63 GFLOPs at 224² (+17%), 66.5 at 1248² (+3.4%): the extra work
    is per token, so it stays O(N).
    """
    return _create_long_range("weightformer_long_range_tiny", pretrained, {"patch_size": 16, "embed_dim": 192,
                                                                         "depth": 17}, kwargs)


@register_model
def weightformer_long_range_small(pretrained: bool = False, **kwargs) -> WeightFormer:
    """:func:`weightformer_long_range_tiny`'s design at 384-d. 39.68M parameters (released S: 27.49M); 12.31
    GFLOPs at 224² (+29%), 263.7 at 1248² (+3.9%; DeiT-S: 944.5)."""
    return _create_long_range("weightformer_long_range_small", pretrained, {"patch_size": 16, "embed_dim": 384,
                                                                          "depth": 17}, kwargs)


def name_unversioned_predictor(checkpoint: dict[str, Any],
                               designs: Collection[str] = tuple(default_cfgs)) -> dict[str, Any]:
    """A checkpoint of format 0, upgraded (a task's upgrade step): a long-range design in ``designs`` whose kwargs
    name no ``linear_predictor`` was trained with ``centered``, so its meta and config name it."""
    meta = checkpoint["meta"]
    if meta.get("model") not in designs or "linear_predictor" in (meta.get("model_kwargs") or {}):
        return checkpoint
    named = {k: {**part, "model_kwargs": {**(part.get("model_kwargs") or {}), "linear_predictor": "centered"}}
             for k, part in checkpoint.items() if k in ("meta", "config") and isinstance(part, dict)}
    return {**checkpoint, **named}
