"""Class-conditional diffusion with WeightFormer-DiT: the model (and the attention DiT baseline), DiT's
Gaussian diffusion, training on the shared engine, sampling and evaluation (``weightformer gen``)."""

from .model import (
    GUIDANCE_MODES,
    DiTBlock,
    WeightFormerDiT,
    WeightFormerDiTBlock,
    checkpoint_filter_fn,
    load_release_state_dict,
)
from .variants import DIT_VARIANTS, create_dit, variant_name

__all__ = [
    "DIT_VARIANTS", "GUIDANCE_MODES", "DiTBlock", "WeightFormerDiT", "WeightFormerDiTBlock", "checkpoint_filter_fn",
    "create_dit", "load_release_state_dict", "variant_name",
]
