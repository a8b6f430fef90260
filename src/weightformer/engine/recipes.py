"""Recipes: which training defaults a task applies to which data, and why.

A task lists its recipes (the offline job's, the paper's full-scale one, a small-data one, ...) and
picks one for the data of a run (:meth:`weightformer.engine.Task.choose_recipe`); the engine layers
the recipe's values under the ``--config`` file and the flags, and the run's first line says which
recipe was chosen and why. A resumed run takes its own saved settings instead of any recipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["Recipe", "RecipeChoice", "count_files"]


@dataclass(frozen=True)
class Recipe:
    """Named training defaults: ``values`` are settings (fields of the task's config)."""

    name: str  # e.g. "offline", "vitdet-coco", "small-data"
    summary: str  # what it is, in a few words: "ViTDet's COCO recipe (100 epochs, LSJ 1024², lr 1e-4 at batch 64)"
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecipeChoice:
    """The recipe a run uses and the reason, as the run's first line prints them."""

    recipe: Recipe
    reason: str

    def line(self) -> str:
        return f"recipe {self.recipe.name}: {self.recipe.summary}; chosen because {self.reason}"


RESUMED = Recipe("resumed", "the settings saved with the run being resumed")


def count_files(folder: Path, extensions: Iterable[str]) -> int:
    """How many files under ``folder`` (recursively, following no links) end in one of ``extensions``.

    A plain directory walk: cheap next to opening the files (COCO's 118k training images count in well
    under a second), so a recipe can depend on the size of a data set before it is loaded."""
    suffixes = tuple(e.lower() for e in extensions)
    total = 0
    for _, _, names in os.walk(folder):
        total += sum(1 for name in names if name.lower().endswith(suffixes))
    return total
