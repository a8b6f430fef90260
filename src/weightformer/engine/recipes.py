"""Recipes: the training settings a task applies to a kind of data, each a YAML file, and why one is chosen.

A task's recipes are ``configs/<task>/*.yaml``: settings (``_base_`` inheritance allowed) and ``recipe: {name:
..., summary: ...}``. The task picks one for a run's data, possibly sized to it; the engine layers it under the
``--config`` file and the flags, and the run's first line says which recipe and why.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from .config import read_yaml_tree
from .errors import ConfigError

__all__ = ["RECIPE_ROOT", "Recipe", "RecipeChoice", "count_files", "load_recipe", "median_side"]

RECIPE_ROOT = (Path(__file__).resolve().parents[1] / "configs").resolve()  # configs/, shipped in the package


@dataclass(frozen=True)
class Recipe:
    """Named training settings: ``values`` are fields of the task's config; ``path`` the file they come from."""

    name: str
    summary: str  # what it is, in a few words
    values: Mapping[str, Any] = field(default_factory=dict)
    path: Optional[Path] = None

    def sized(self, **values: Any) -> Recipe:
        """This recipe with ``values`` read off the data (an image size, a number of epochs) over the file's."""
        return replace(self, values={**self.values, **values})


@dataclass(frozen=True)
class RecipeChoice:
    """The recipe a run uses and the reason, as the run's first line prints them."""

    recipe: Recipe
    reason: str

    def line(self) -> str:
        """The run's first line: the recipe, why, and its file (``configs/<task>/<file>`` for a shipped one)."""
        path = self.recipe.path
        if path is not None and path.resolve().is_relative_to(RECIPE_ROOT):
            path = Path("configs") / path.resolve().relative_to(RECIPE_ROOT)
        where = f"; file {path}" if path is not None else ""
        return f"recipe {self.recipe.name}: {self.recipe.summary}; chosen because {self.reason}{where}"


RESUMED = Recipe("resumed", "the settings saved with the run being resumed")


def load_recipe(path: str | Path, task: Optional[str] = None) -> Recipe:
    """The recipe in YAML file ``path`` (``configs/<task>/<path>`` with ``task``), its bases merged; ConfigError
    if it names none."""
    path = RECIPE_ROOT / task / path if task else path
    values = read_yaml_tree(path, "recipe file")
    about = values.pop("recipe", None)
    if not isinstance(about, dict) or not all(isinstance(about.get(k), str) for k in ("name", "summary")):
        raise ConfigError(f"recipe file {path} needs `recipe: {{name: ..., summary: ...}}`, the name and summary "
                          f"a run's first line prints")
    return Recipe(about["name"], about["summary"], values, Path(path))


def count_files(folder: Path, extensions: Iterable[str]) -> int:
    """How many files under ``folder`` (recursively, following no links) end in one of ``extensions``: a plain
    walk, cheap enough for a recipe to depend on a data set's size before it is loaded."""
    suffixes = tuple(e.lower() for e in extensions)
    return sum(sum(1 for name in names if name.lower().endswith(suffixes)) for _, _, names in os.walk(folder))


def median_side(folder: Path, sample: int, side: Callable[[tuple[int, int]], int] = min,
                extensions: Optional[Iterable[str]] = None) -> Optional[float]:
    """The median ``side`` (min: the short one, max: the long one) of the first ``sample`` readable images under
    ``folder`` (headers only, :func:`~weightformer.data.images.image_sizes`), or None when none is readable."""
    from ..data.images import IMG_EXTENSIONS, image_sizes  # PIL and torch: here, as the command line needs neither

    sides = [side(size) for size in image_sizes(folder, sample, tuple(extensions or IMG_EXTENSIONS))]
    return statistics.median(sides) if sides else None
