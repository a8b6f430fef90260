"""Classification's recipes (``configs/classification/``) and the rule that picks one for the data: a bundled
set's own; for an ImageFolder tree, tar shards or a Hugging Face data set, the release's ImageNet recipe from :data:`FULL_SCALE_IMAGES` training
images on, else fine-tuning the ``--init`` weights, else the small-data recipe (at the images' own size with
a narrow model when they are small)."""

from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path
from typing import Any, Mapping

from ..data.builtin import BUILTIN_DATASETS
from ..engine.recipes import Recipe, RecipeChoice, count_files, load_recipe, median_side

__all__ = ["FULL_SCALE_IMAGES", "choose_recipe", "recipe", "recipes"]

FULL_SCALE_IMAGES = 100_000  # training images from which a folder gets the release's ImageNet recipe
SMALL_IMAGE_SIDE = 96  # below this typical side, a small-data run keeps the images' size, with 4 px patches
_SIDES_SAMPLED = 32  # image headers read to find a folder's typical side (as many for shards and HF data)

recipe = partial(load_recipe, task="classification")


def recipes() -> tuple[Recipe, ...]:
    return tuple(map(recipe, ("mnist.yaml", "imagenet_weightformer_t.yaml", "small-data.yaml", "fine-tune.yaml")))


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring."""
    from ..data import train_split_images  # PIL and torch: here, so the command line starts without them
    from ..data.folder import IMG_EXTENSIONS

    if data in BUILTIN_DATASETS:
        spec = BUILTIN_DATASETS[data]
        if spec.probe:
            return RecipeChoice(recipe("probe.yaml").sized(img_size=spec.img_size), f"{data} is a bundled data set")
        return RecipeChoice(recipe(f"{data}.yaml"), f"{data} is a bundled data set")
    split = settings.get("train_split") or "train"
    found = train_split_images(data, split, (settings.get("image_column") or "image",
                                             settings.get("label_column") or "label"),
                               verify=settings.get("verify_images", True))
    if found is None:  # an ImageFolder tree
        train = Path(data).expanduser() / split
        where, images = str(train), count_files(train, IMG_EXTENSIONS) if train.is_dir() else 0
    else:
        where, images, sizes = found
    held = f"{where} holds {images} images"
    if images >= FULL_SCALE_IMAGES:
        return RecipeChoice(recipe("imagenet_weightformer_t.yaml"),
                            f"{held}, ImageNet's scale (at least {FULL_SCALE_IMAGES})")
    fewer = f"fewer than the {FULL_SCALE_IMAGES} the ImageNet recipe needs"
    if settings.get("init"):
        return RecipeChoice(recipe("fine-tune.yaml"), f"{held}, {fewer}, and --init gives weights to start from")
    if found is None:
        median = median_side(train, _SIDES_SAMPLED)
    else:
        median = statistics.median(min(size) for size in sizes) if sizes else None
    no_init = "and there is no --init to fine-tune (pass --init to fine-tune weights)"
    if median is None or median >= SMALL_IMAGE_SIDE:
        return RecipeChoice(recipe("small-data.yaml"), f"{held}, {fewer}, {no_init}")
    side = int(median)
    size = max(16, -(-side // 4) * 4)  # a multiple of the 4 px patch
    return RecipeChoice(recipe("small-images.yaml").sized(img_size=size),
                        f"{held} of {side} px, {fewer}, {no_init}; img_size {size}")
