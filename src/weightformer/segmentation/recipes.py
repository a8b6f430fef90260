"""Segmentation's recipes (``configs/segmentation/``) and the rule that picks one: the offline job's for shapes;
for an ADE20K-layout folder, the paper's ADE20K recipe when ``--init`` gives the backbone and there are
:data:`FULL_SCALE_IMAGES` training images, else fine-tuning ``--init``, else learning from scratch, both on crops
sized to the folder's images. A recipe's head and neck settings (:data:`.config.PROTOCOL_KWARGS`) are those of
its own protocol: under another ``--protocol`` they are left out, and that protocol's own apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from ..data.errors import DataError
from ..engine.recipes import Recipe, RecipeChoice, count_files, load_recipe, median_side
from .config import DEFAULT_PROTOCOL, PROTOCOL_KWARGS
from .synthetic import SHAPES_NAME

__all__ = ["FULL_SCALE_IMAGES", "choose_recipe", "recipe", "recipes"]

FULL_SCALE_IMAGES = 10_000  # half of ADE20K's: its 95 epochs still take about 30k steps at batch 32
SMALL_CROP = 256  # the small-data recipes' training crop, for photographs
SAMPLED_IMAGES = 32  # images whose sizes pick a smaller crop for small images (headers only)
ADE20K = "ade20k_upernet_weightformer_s_vim_60k.yaml"


def recipe(file: str, crop: int = SMALL_CROP) -> Recipe:
    """The recipe in ``file``; the small-data ones on ``crop`` px crops, with a stride of two thirds of it."""
    loaded = load_recipe(file, "segmentation")
    if file not in ("small-data.yaml", "fine-tune.yaml") or crop == SMALL_CROP:
        return loaded
    return loaded.sized(img_size=crop, seg_crop=crop, seg_stride=round(crop * 2 / 3))


def recipes() -> tuple[Recipe, ...]:
    return tuple(map(recipe, ("shapes.yaml", ADE20K, "small-data.yaml", "fine-tune.yaml")))


def _crop_for(train_dir: Path) -> tuple[int, str]:
    """The small-data crop for ``train_dir``'s images, and what the reason says of it: :data:`SMALL_CROP`, or for
    smaller images their median short side rounded down to a multiple of 32 (the coarsest stride), at least 64."""
    from .data import IMAGE_EXTENSIONS  # here: segmentation.data imports torch, and the CLI starts without it

    median = median_side(train_dir, SAMPLED_IMAGES, min, IMAGE_EXTENSIONS)
    if median is None or median >= SMALL_CROP:
        return SMALL_CROP, ""
    crop = max(64, int(median) // 32 * 32)
    return crop, f"; {crop} px crops, as its images are small (median short side {int(median)} px)"


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring."""
    choice = _choose(data, settings)
    own, protocol = choice.recipe.values.get("seg_protocol", DEFAULT_PROTOCOL), settings.get("seg_protocol")
    kwargs = dict(choice.recipe.values.get("model_kwargs") or {})
    left_out = [key for key in PROTOCOL_KWARGS if key in kwargs]
    if protocol in (None, own) or not left_out:
        return choice
    kept = {key: value for key, value in kwargs.items() if key not in left_out}
    return RecipeChoice(choice.recipe.sized(model_kwargs=kept),
                        f"{choice.reason}; under --protocol {protocol} its {own} head and neck settings "
                        f"({', '.join(f'{key}={kwargs[key]}' for key in left_out)}) are left out")


def _choose(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    from .data import IMAGE_EXTENSIONS, find_root  # here: segmentation.data imports torch

    if data == SHAPES_NAME:
        return RecipeChoice(recipe("shapes.yaml"), "shapes is the offline data set")
    small = "fine-tune.yaml" if settings.get("init") else "small-data.yaml"
    try:
        root = find_root(data)
    except DataError:  # the run's data scan reports what was looked for
        return RecipeChoice(recipe(small), f"{data} holds no training images in a layout this package reads")
    train_dir = root / "images" / "training"
    images = count_files(train_dir, IMAGE_EXTENSIONS)
    held = f"{train_dir} holds {images} training images"
    if images >= FULL_SCALE_IMAGES and settings.get("init"):
        return RecipeChoice(recipe(ADE20K), f"{held} (at least {FULL_SCALE_IMAGES}) and --init gives a pretrained "
                                            f"backbone")
    crop, crop_reason = _crop_for(train_dir)
    size = (f"fewer than the {FULL_SCALE_IMAGES} the paper's ADE20K recipe needs" if images < FULL_SCALE_IMAGES
            else "enough for the paper's ADE20K recipe, which fine-tunes a pretrained backbone")
    if settings.get("init"):
        return RecipeChoice(recipe(small, crop), f"{held}, {size}; --init gives the weights to fine-tune{crop_reason}")
    return RecipeChoice(recipe(small, crop), f"{held}, {size}; there is no --init, so a small model trains from "
                                             f"scratch (pass --init with a pretrained backbone to fine-tune){crop_reason}")
