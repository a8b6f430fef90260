"""Generation's recipes (``configs/generation/``) and the rule that picks one: the offline job's for a bundled
set; for an ImageFolder tree, DiT's from :data:`FULL_SCALE_IMAGES` training images on (DiT trains from scratch:
``--init`` does not count), else the small-data recipe, sized for the folder."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any, Mapping

from ..data.builtin import BUILTIN_DATASETS
from ..engine.recipes import Recipe, RecipeChoice, count_files, load_recipe, median_side

__all__ = ["FULL_SCALE_IMAGES", "OFFLINE_STEPS", "SMALL_EPOCHS", "choose_recipe", "recipe", "recipes",
           "small_data_recipe"]

FULL_SCALE_IMAGES = 100_000  # DiT's recipe: its EMA spans ~10k steps, and 80 epochs at batch 256 give 30k
OFFLINE_STEPS = 3_250  # the offline job's optimizer steps (13 epochs of 8,000 digits at batch 32)
SMALL_EPOCHS = (13, 500)  # the small-data recipe's epochs: at least the offline job's, at most 500
SIZE_SAMPLE = 16  # images whose size the small-data recipe reads (headers only) to choose img_size
IN_PROCESS_IMAGES = 2_000  # the small-data recipe decodes up to this many training images in the training process


recipe = partial(load_recipe, task="generation")


def recipes() -> tuple[Recipe, ...]:
    return tuple(map(recipe, ("mnist.yaml", "dit.yaml", "small-data.yaml")))


def _image_side(train: Path, vae: bool) -> tuple[int | None, int]:
    """(the median short side of the first images under ``train`` or None, the img_size for it): that side rounded
    down to a multiple of 4 (patch 4 tiles it), 16 to 64 px; with a VAE to a multiple of 32, 64 to 256 px (its 8x
    smaller latents still give patch 4 a grid); 32 px when no image is readable."""
    median = median_side(train, SIZE_SAMPLE)
    if median is None:
        return None, 32
    side = int(median)
    step, low, high = (32, 64, 256) if vae else (4, 16, 64)
    return side, min(max(side // step * step, low), high)


def small_data_recipe(train: Path, images: int, settings: Mapping[str, Any]) -> tuple[Recipe, str]:
    """The small-data recipe for ``images`` training images under ``train``, and what it was chosen from:
    the image size for the images' sides (unless ``settings`` give one), the epochs that take about
    :data:`OFFLINE_STEPS` steps at the run's batch (the user's, else the recipe's; one process), and
    data-loading workers only for more than :data:`IN_PROCESS_IMAGES` images (the loop starts them every epoch)."""
    small = recipe("small-data.yaml")
    side, img_size = _image_side(train, bool(settings.get("vae")))
    batch = min(int(settings.get("batch_size", small.values["batch_size"])), max(images, 1))
    steps_per_epoch = max(images // batch, 1)
    epochs = min(max(math.ceil(OFFLINE_STEPS / steps_per_epoch), SMALL_EPOCHS[0]), SMALL_EPOCHS[1])
    given = settings.get("img_size")
    sized = (f"the img_size given, {given} px" if given is not None else
             f"{img_size} px for its {side} px images" if side else f"{img_size} px (no image read)")
    steps = "1 step" if steps_per_epoch == 1 else f"{steps_per_epoch} steps"
    return (small.sized(img_size=img_size, epochs=epochs, workers=0 if images <= IN_PROCESS_IMAGES else 4),
            f"{sized}, {epochs} epochs of {steps} at batch {batch} (~{epochs * steps_per_epoch} steps)")


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring."""
    from ..data.folder import IMG_EXTENSIONS  # torchvision's: here, so the command line starts without it

    if data in BUILTIN_DATASETS:
        offline = recipe("mnist.yaml")
        size = BUILTIN_DATASETS[data].img_size
        at = "" if size == offline.values["img_size"] else f", at its {size} px"
        return RecipeChoice(offline.sized(img_size=size), f"{data} is a bundled data set{at}")
    train = Path(data).expanduser() / "train"
    images = count_files(train, IMG_EXTENSIONS) if train.is_dir() else 0
    if images >= FULL_SCALE_IMAGES:
        return RecipeChoice(recipe("dit.yaml"), f"{train} holds {images} images, at least the {FULL_SCALE_IMAGES} of "
                                                f"a data set of real size (DiT trains from scratch: no --init is needed)")
    small, detail = small_data_recipe(train, images, settings)
    return RecipeChoice(small, f"{train} holds {images} images, fewer than the {FULL_SCALE_IMAGES} DiT's recipe needs "
                               f"(the training images count, not --init: DiT trains from scratch); {detail}")
