"""Class-conditional diffusion with WeightFormer-DiT (``weightformer gen``): the model and the attention DiT
(exported from :mod:`weightformer.models.dit`), DiT's Gaussian diffusion, training, sampling and evaluation.
Names are imported on first use (PEP 562), so the command line reads :class:`GenerationTask` and its settings
without importing torch."""

from ..lazy import lazy_exports

_EXPORTS = {
    "GUIDANCE_MODES": "config", "DiTBlock": ".models.dit", "WeightFormerDiT": ".models.dit",
    "WeightFormerDiTBlock": ".models.dit", "checkpoint_filter_fn": ".models.dit", "load_release_state_dict": ".models.dit",
    "DIT_VARIANTS": ".models.dit_variants", "create_dit": ".models.dit_variants", "variant_name": ".models.dit_variants",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
