"""What the sweep can measure and the checks of its settings, importable without torch.

``weightformer bench --help`` and a bad flag are answered from this module, :mod:`.options` and
:mod:`.variants` alone; the sweep itself (:mod:`.sweep`) imports torch when it runs.
"""

from typing import Sequence

from .variants import INFER, TRAIN, VARIANTS, get_variant

MEASUREMENTS = ("infer", "train", "memory", "flops")
MODES = (INFER, TRAIN)
DTYPES = ("float32", "bfloat16", "float16")
PATCH = 16  # every benchmarked model cuts images into 16×16 patches
OUTPUT_NAMES = ("results.json", "results.csv", "results.md", "scaling.png")


def check_models(models: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``models`` is a non-empty list of known model keys."""
    if not models:
        raise ValueError(f"no models given; choose from {', '.join(VARIANTS)}")
    for key in models:
        get_variant(key)


def check_resolution(resolution: int) -> None:
    """Raise ``ValueError`` unless ``resolution`` is a positive multiple of the 16-pixel patch."""
    if resolution < PATCH or resolution % PATCH:
        raise ValueError(f"resolution {resolution} is not a positive multiple of {PATCH} (the patch size), e.g. 224")


def check_choices(what: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``values`` is a non-empty selection from ``allowed``."""
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        given = ", ".join(map(repr, unknown)) or "(none given)"
        raise ValueError(f"unknown {what} {given}; choose from {', '.join(allowed)}")
