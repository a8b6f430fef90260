"""Class-conditional diffusion with WeightFormer-DiT (``weightformer gen``): the model and the attention DiT,
DiT's Gaussian diffusion, training, sampling and evaluation. Names are imported on first use (PEP 562), so the
command line reads :class:`GenerationTask` and its settings without importing torch."""

from ..lazy import lazy_exports

_EXPORTS = {
    "GUIDANCE_MODES": "config", "DiTBlock": "model", "WeightFormerDiT": "model", "WeightFormerDiTBlock": "model",
    "checkpoint_filter_fn": "model", "load_release_state_dict": "model", "DIT_VARIANTS": "variants",
    "create_dit": "variants", "variant_name": "variants",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
