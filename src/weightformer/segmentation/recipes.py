"""Segmentation's recipes: the offline shapes set's own, the paper's ADE20K UperNet recipe, and two for a
user's own folder that the paper's recipe does not fit (from scratch, or fine-tuning ``--init`` weights).

The paper's recipe is Vim's ViT UperNet protocol (hustvl/Vim
``seg/configs/vim/upernet/upernet_vim_small_24_512_slide_60k.py``, the protocol of the DeiT-S 44.0 mIoU
the paper compares with): WeightFormer-S under ``seg_protocol: vim``, 60k steps at 4 x 8 crops of 512 px
(95 epochs), AdamW 1e-4, layer decay 0.92. It fine-tunes a pretrained backbone on ADE20K's 20,210 images
and is chosen only where it fits: ``--init`` gives the backbone AND the folder holds at least
:data:`FULL_SCALE_IMAGES` training images (half of ADE20K's, so its 95 epochs still take about 30k steps
at batch 32). Anywhere else it would take a few steps an epoch at a learning rate meant for pretrained
weights. A smaller folder, or one without ``--init``, gets the shapes job's recipe, which is known to learn
(docs/dense.md): batch 16, lr 1e-3 at that batch, 50 epochs, on crops sized for the user's images.
mmseg's DeiT-S 160k schedule is the named alternative, ``configs/ade20k_upernet_weightformer_s_160k.yaml``.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping

from ..data.errors import DataError
from ..engine.recipes import Recipe, RecipeChoice, count_files
from .synthetic import SHAPES_NAME

__all__ = ["ADE20K", "FINE_TUNE", "FULL_SCALE_IMAGES", "OFFLINE", "RECIPES", "SMALL_DATA", "choose_recipe",
           "fine_tune", "small_data"]

FULL_SCALE_IMAGES = 10_000  # training images from which a folder with --init gets the paper's recipe
SMALL_CROP = 256  # the small-data recipes' training crop, for photographs
SAMPLED_IMAGES = 32  # images whose sizes pick a smaller crop for small images (headers only)


def _stride(crop: int) -> int:
    """The sliding-window stride for ``crop``: two thirds of it, as mmseg's 341 for 512."""
    return round(crop * 2 / 3)


# The shapes job: a 4-block, 96-d WeightFormer-T (1.14M parameters) on 64 px crops, 13 steps an epoch.
OFFLINE = Recipe("offline", "the shapes set's small-CPU recipe (a 4-block 96-d WeightFormer-T, 64 px crops, batch "
                            "16, 50 epochs, lr 1e-3)", {
    "model": "weightformer_tiny",
    "model_kwargs": {"embed_dim": 96, "depth": 4, "channels": 64, "pyramid_channels": 64, "aux_channels": 32},
    "img_size": 64, "epochs": 50, "batch_size": 16,
    "lr": 3.2e-2, "min_lr": 3.2e-4, "warmup_lr": 3.2e-5,  # per total batch of 512: 1e-3 at batch 16
    "warmup_epochs": 1, "workers": 1, "seg_crop": 64, "seg_stride": 43,
})

# configs/ade20k_upernet_weightformer_s_vim_60k.yaml without its data and output, and without num_classes:
# the data's own count applies (ADEChallengeData2016's objectInfo150.txt lists its 150).
ADE20K = Recipe("ade20k-upernet", "the paper's ADE20K UperNet recipe (Vim's ViT UperNet protocol: WeightFormer-S "
                                  "blocks 4/8/12/16 at strides 4-32, 512 px crops, batch 8 per process, 32 on 4 GPUs, "
                                  "60k steps, AdamW 1e-4 at batch 32, layer decay 0.92, poly decay, sliding-window "
                                  "evaluation)", {
    "model": "weightformer_small", "model_kwargs": {"drop_path_rate": 0.1}, "seg_protocol": "vim",
    "reduce_zero_label": True, "img_size": 512, "epochs": 95, "batch_size": 8, "opt": "adamw",
    "lr": 1.6e-3, "weight_decay": 0.05, "layer_decay": 0.92, "sched": "poly", "decay_rate": 1.0, "min_lr": 0.0,
    "warmup_epochs": 2.377, "warmup_lr": 1.6e-9, "clip_grad": None, "hflip": 0.5,
    "seg_inference": "slide", "seg_crop": 512, "seg_stride": 341, "amp": "none", "workers": 4,
})


def small_data(crop: int = SMALL_CROP) -> Recipe:
    """The shapes job's recipe on ``crop`` px crops: its model from scratch, batch 16, lr 1e-3, 50 epochs."""
    values = {key: value for key, value in OFFLINE.values.items() if key != "workers"}  # photos: the default workers
    return Recipe("small-data", f"the shapes job's recipe on {crop} px crops (a 4-block 96-d WeightFormer-T from "
                                f"scratch, batch 16, 50 epochs, lr 1e-3)",
                  {**values, "img_size": crop, "seg_crop": crop, "seg_stride": _stride(crop)})


def fine_tune(crop: int = SMALL_CROP) -> Recipe:
    """The shapes job's schedule on ``crop`` px crops for the ``--init`` weights: the model as named
    (so the weights fit), lr 1e-4 at batch 16, the paper's weight decay."""
    return Recipe("fine-tune", f"fine-tune the --init backbone on {crop} px crops (batch 16, 50 epochs, lr 1e-4, "
                               f"weight decay 0.01)", {
        "img_size": crop, "epochs": 50, "batch_size": 16,
        "lr": 3.2e-3, "min_lr": 3.2e-5, "warmup_lr": 3.2e-6,  # per total batch of 512: 1e-4 at batch 16
        "warmup_epochs": 1, "weight_decay": 0.01, "seg_crop": crop, "seg_stride": _stride(crop),
    })


SMALL_DATA = small_data()
FINE_TUNE = fine_tune()
RECIPES = (OFFLINE, ADE20K, SMALL_DATA, FINE_TUNE)


def _crop_for(train_dir: Path) -> tuple[int, str]:
    """The small-data crop for the images of ``train_dir``: :data:`SMALL_CROP`, or, for smaller images,
    the median short side of the first :data:`SAMPLED_IMAGES` (read from their headers) rounded down to
    a multiple of 32 (the backbone's coarsest stride), at least 64; and what the reason says about it."""
    from ..data.images import image_sizes  # here, as below: the CLI starts without numpy/PIL
    from .data import IMAGE_EXTENSIONS  # here: segmentation.data imports torch, and the CLI starts without it

    sides = [min(size) for size in image_sizes(train_dir, SAMPLED_IMAGES, IMAGE_EXTENSIONS)]
    if not sides or statistics.median(sides) >= SMALL_CROP:
        return SMALL_CROP, ""
    median = int(statistics.median(sides))
    crop = max(64, median // 32 * 32)
    return crop, f"; {crop} px crops, as its images are small (median short side {median} px)"


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring: shapes' own; for a folder, by its training images and ``--init``."""
    from .data import IMAGE_EXTENSIONS, find_root  # here: segmentation.data imports torch

    if data == SHAPES_NAME:
        return RecipeChoice(OFFLINE, "shapes is the offline data set")
    init = settings.get("init")
    try:
        root = find_root(data)
    except DataError:  # the run's data scan reports what was looked for
        recipe = FINE_TUNE if init else SMALL_DATA
        return RecipeChoice(recipe, f"{data} holds no training images in a layout this package reads")
    train_dir = root / "images" / "training"
    images = count_files(train_dir, IMAGE_EXTENSIONS)
    held = f"{train_dir} holds {images} training images"
    if images >= FULL_SCALE_IMAGES and init:
        return RecipeChoice(ADE20K, f"{held} (at least {FULL_SCALE_IMAGES}) and --init gives a pretrained backbone")
    crop, crop_reason = _crop_for(train_dir)
    size = (f"fewer than the {FULL_SCALE_IMAGES} the paper's ADE20K recipe needs" if images < FULL_SCALE_IMAGES
            else "enough for the paper's ADE20K recipe, which fine-tunes a pretrained backbone")
    if init:
        return RecipeChoice(fine_tune(crop), f"{held}, {size}; --init gives the weights to fine-tune{crop_reason}")
    return RecipeChoice(small_data(crop), f"{held}, {size}; there is no --init, so a small model trains from scratch "
                                          f"(pass --init with a pretrained backbone to fine-tune){crop_reason}")
