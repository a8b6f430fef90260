"""Classification's recipes: the bundled sets' own, the release's ImageNet recipe, and two for a user's
own ImageFolder tree that is smaller than ImageNet (from scratch, or fine-tuning ``--init`` weights).

The release's recipe (300 epochs at 8 x 256 images, RandAugment, Mixup/CutMix, erasing) needs
ImageNet's size: on a few hundred images it takes one step an epoch. A smaller folder gets a recipe
that takes hundreds of steps in a few dozen epochs, with the augmentation small data can bear.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping

from ..data.builtin import BUILTIN_DATASETS
from ..engine.recipes import Recipe, RecipeChoice, count_files

__all__ = ["FINE_TUNE", "FULL_SCALE_IMAGES", "IMAGENET", "RECIPES", "SMALL_DATA", "choose_recipe", "offline_recipe"]

FULL_SCALE_IMAGES = 100_000  # training images from which a folder gets the release's ImageNet recipe

# The release's recipe is ClassificationConfig's own defaults.
IMAGENET = Recipe("imagenet", "the release's ImageNet-1K recipe (300 epochs, batch 256 per process, lr 5e-4 per 512, "
                              "RandAugment, Mixup/CutMix, erasing)", {})
# From scratch on a few hundred to tens of thousands of images: batch 32 (so even 300 images give 9
# steps an epoch), 100 epochs, RandAugment and erasing but no Mixup/CutMix (they need long schedules),
# lr 4e-3 per 512 (2.5e-4 at batch 32), 5 warm-up epochs.
SMALL_DATA = Recipe("small-data", "WeightFormer-T from scratch, batch 32, 100 epochs, RandAugment without "
                                  "Mixup/CutMix", {
    "epochs": 100, "batch_size": 32, "lr": 4e-3, "min_lr": 4e-5, "warmup_lr": 4e-6, "warmup_epochs": 5,
    "mixup": 0.0, "cutmix": 0.0, "train_scale": (0.35, 1.0),
})
# Fine-tuning --init weights (the authors' ImageNet checkpoint, say) on a smaller set: DeiT's
# fine-tuning rates (lr 1e-4 at batch 64: 8e-4 per 512), 30 epochs, 2 of warm-up, light augmentation.
FINE_TUNE = Recipe("fine-tune", "fine-tune the --init weights: batch 32, 30 epochs, lr 8e-4 per 512, light "
                                "augmentation", {
    "epochs": 30, "batch_size": 32, "lr": 8e-4, "min_lr": 8e-6, "warmup_lr": 8e-7, "warmup_epochs": 2,
    "weight_decay": 0.05, "mixup": 0.0, "cutmix": 0.0, "reprob": 0.0, "train_scale": (0.35, 1.0),
})


SMALL_IMAGE_SIDE = 96  # below this typical side, a small-data run keeps the images' size, with 4 px patches
_SIDES_SAMPLED = 32  # image headers read to find a folder's typical side


def typical_side(folder: Path) -> int | None:
    """The median shorter side of the first few images under ``folder`` (headers only), or None."""
    from ..data.images import image_sizes  # PIL and torch: here, so the command line starts without them

    sides = [min(size) for size in image_sizes(folder, _SIDES_SAMPLED)]
    return int(statistics.median(sides)) if sides else None


def small_data_recipe(side: int | None) -> Recipe:
    """:data:`SMALL_DATA`, at the images' own size with MNIST's model (4 px patches, 96 wide, 4 blocks)
    when they are small (CIFAR-like 32 px images would be 2x2 tokens at patch 16), else at 224 px."""
    if side is None or side >= SMALL_IMAGE_SIDE:
        return SMALL_DATA
    size = max(16, -(-side // 4) * 4)  # a multiple of the 4 px patch
    # A 0.4M-parameter model on a few hundred small images underfits under RandAugment and erasing: on
    # 400 MNIST digits (a folder of PNGs), 100 epochs reached 37.5% top-1 with them at lr 4e-3, 84.0%
    # without them at lr 1.6e-2 (1e-3 at batch 32), in 2.5 minutes of one CPU thread.
    return Recipe(SMALL_DATA.name, f"a narrow WeightFormer (4 px patches) from scratch at the images' {size} px, "
                                   f"batch 32, 100 epochs, random crops and flips only",
                  {**SMALL_DATA.values, "img_size": size, "model": "weightformer_tiny", "lr": 1.6e-2,
                   "min_lr": 1.6e-4, "warmup_lr": 1.6e-5, "auto_augment": None, "reprob": 0.0,
                   "model_kwargs": {"patch_size": 4, "embed_dim": 96, "depth": 4, "drop_path_rate": 0.0}})


def offline_recipe(data: str) -> Recipe:
    """The recipe a bundled data set brings (:data:`weightformer.data.BUILTIN_DATASETS`)."""
    spec = BUILTIN_DATASETS[data]
    return Recipe("offline", f"the bundled {data.partition(':')[0]} set's own small-CPU recipe", dict(spec.defaults))


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring: a bundled set's own; for a folder, by its size and ``--init``."""
    from ..data.folder import IMG_EXTENSIONS  # torchvision's: here, so the command line starts without it

    if data in BUILTIN_DATASETS:
        return RecipeChoice(offline_recipe(data), f"{data} is a bundled data set")
    train = Path(data).expanduser() / "train"
    images = count_files(train, IMG_EXTENSIONS) if train.is_dir() else 0
    init = settings.get("init")
    if images >= FULL_SCALE_IMAGES:
        return RecipeChoice(IMAGENET, f"{train} holds {images} images, ImageNet's scale (at least {FULL_SCALE_IMAGES})")
    if init:
        return RecipeChoice(FINE_TUNE, f"{train} holds {images} images, fewer than the {FULL_SCALE_IMAGES} the "
                                       f"ImageNet recipe needs, and --init gives weights to start from")
    side = typical_side(train)
    small = small_data_recipe(side)
    sides = f" of {side} px" if small is not SMALL_DATA else ""
    return RecipeChoice(small, f"{train} holds {images} images{sides}, fewer than the {FULL_SCALE_IMAGES} the ImageNet "
                               f"recipe needs, and there is no --init to fine-tune (pass --init to fine-tune weights)")


RECIPES = (IMAGENET, SMALL_DATA, FINE_TUNE)
