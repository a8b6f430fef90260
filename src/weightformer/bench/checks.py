"""The settings every benchmark command accepts, and their checks: each bad value is one ConfigError line."""

from __future__ import annotations

import math
from typing import Sequence

from ..engine.errors import ConfigError
from .subjects import INFER, TRAIN, suite

MEASUREMENTS = ("infer", "train", "memory", "flops")
MODES = (INFER, TRAIN)
DTYPES = ("float32", "bfloat16", "float16")
RUNTIMES = ("eager", "compile")  # compile: torch.compile as `train --compile` applies it (engine.loop.compiled)
# cached: glibc keeps freed memory for reuse in the timing process (timing.keep_freed_memory); system: its defaults
ALLOCATORS = ("cached", "system")
PATCH = 16  # every classifier of the sweep cuts images into 16×16 patches
SWEEP_FILES = ("results.json", "results.csv", "results.md", "scaling.png")


def check_number(what: str, value: float, minimum: float, inclusive: bool = True) -> None:
    if not (math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
        raise ConfigError(f"{what} must be a number {'>=' if inclusive else '>'} {minimum:g}, got {value!r}")


def check_choices(what: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        given = ", ".join(map(repr, unknown)) or "(none given)"
        raise ConfigError(f"unknown {what} {given}; choose from {', '.join(allowed)}")


def check_models(models: Sequence[str], suite_name: str = "cls") -> None:
    if not models:
        raise ConfigError(f"no models given; choose from {', '.join(suite(suite_name))}")
    check_choices("model", models, list(suite(suite_name)))


def check_resolution(resolution: int) -> None:
    if resolution < PATCH or resolution % PATCH:
        raise ConfigError(f"resolution {resolution} is not a positive multiple of {PATCH} (the patch size), e.g. 224")


def check_device(device: str) -> str:
    """``device`` as a result records it (``auto`` becomes cuda or cpu), checked by the engine's ``pick_device``."""
    from ..engine.device import pick_device

    picked = pick_device(str(device))
    return picked.type if device == "auto" else str(device)
