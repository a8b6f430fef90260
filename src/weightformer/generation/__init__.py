"""Class-conditional diffusion with WeightFormer-DiT: the model (and the attention DiT baseline), DiT's
Gaussian diffusion, training on the shared engine, sampling and evaluation (``weightformer gen``).

The names are imported from their submodules on first use (PEP 562), so that the command line reads
:class:`GenerationTask` and its settings without importing torch.
"""

from .. import _lazy_exports

__getattr__, __dir__ = _lazy_exports(__name__, {
    "GUIDANCE_MODES": "config", "DiTBlock": "model", "WeightFormerDiT": "model", "WeightFormerDiTBlock": "model",
    "checkpoint_filter_fn": "model", "load_release_state_dict": "model", "DIT_VARIANTS": "variants",
    "create_dit": "variants", "variant_name": "variants",
})

__all__ = [
    "DIT_VARIANTS", "GUIDANCE_MODES", "DiTBlock", "WeightFormerDiT", "WeightFormerDiTBlock", "checkpoint_filter_fn",
    "create_dit", "load_release_state_dict", "variant_name",
]
