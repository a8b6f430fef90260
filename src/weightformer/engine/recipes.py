"""Recipes: the training settings a task applies to a kind of data, each a YAML file, and why one is chosen.

A task's recipes are the files under ``configs/<task name>/`` (:func:`recipe_path`); each holds
settings (fields of the task's config, with ``_base_`` inheritance, :func:`~.config.read_yaml_tree`)
and ``recipe: {name: ..., summary: ...}``. The task picks one for the data of a run
(:meth:`weightformer.engine.Task.choose_recipe`), possibly with values read off the data (an image
size); the engine layers its values under the ``--config`` file and the flags, and the run's first
line says which recipe was chosen and why. A resumed run takes its own saved settings instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

from .config import read_yaml_tree
from .errors import ConfigError

__all__ = ["RECIPE_ROOT", "Recipe", "RecipeChoice", "count_files", "load_recipe", "recipe_path"]

RECIPE_ROOT = (Path(__file__).resolve().parents[1] / "configs").resolve()  # the repository's configs/, shipped in the package


@dataclass(frozen=True)
class Recipe:
    """Named training settings: ``values`` are fields of the task's config; ``path`` the file they come from."""

    name: str  # e.g. "offline", "coco-cascade", "small-data"
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


def recipe_path(task: str, file: str) -> Path:
    """The recipe file ``file`` of the task named ``task``: ``configs/<task>/<file>``."""
    return RECIPE_ROOT / task / file


def load_recipe(path: str | Path) -> Recipe:
    """The recipe in YAML file ``path`` (its bases merged), or ConfigError if it names none."""
    values = read_yaml_tree(path, "recipe file")
    about = values.pop("recipe", None)
    if not isinstance(about, dict) or not all(isinstance(about.get(k), str) for k in ("name", "summary")):
        raise ConfigError(f"recipe file {path} needs `recipe: {{name: ..., summary: ...}}`, the name and summary "
                          f"a run's first line prints")
    return Recipe(about["name"], about["summary"], values, Path(path))


def count_files(folder: Path, extensions: Iterable[str]) -> int:
    """How many files under ``folder`` (recursively, following no links) end in one of ``extensions``:
    a plain directory walk, cheap enough (COCO's 118k images in under a second) for a recipe to
    depend on the size of a data set before it is loaded."""
    suffixes = tuple(e.lower() for e in extensions)
    return sum(sum(1 for name in names if name.lower().endswith(suffixes)) for _, _, names in os.walk(folder))
