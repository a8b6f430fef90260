"""Detection's recipes: the offline shapes job's, ViTDet's COCO recipe, and two for a user's own folder
that the COCO recipe does not fit (from scratch, or fine-tuning ``--init`` weights).

ViTDet's recipe (100 epochs of large-scale jitter at 1024², lr 1e-4 at batch 64, layer decay) fine-tunes
an ImageNet-pretrained backbone on COCO's 118k images; it needs both. A folder without ``--init``
weights gets the shapes job's recipe, which learns from scratch (a narrow, shallow WeightFormer, flips
only, 16 epochs at batch 4), at a size read off the folder's images. A folder with ``--init`` but fewer
than :data:`FULL_SCALE_IMAGES` training images gets a short fine-tuning schedule with ViTDet's
regularisation, on the ``--init`` backbone as it is.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Mapping, Optional

from ..engine.recipes import Recipe, RecipeChoice, count_files
from . import synthetic

__all__ = ["FINE_TUNE", "FULL_SCALE_IMAGES", "OFFLINE", "RECIPES", "SMALL_DATA", "VITDET", "choose_recipe",
           "image_side"]

# Training images from which a folder with --init weights gets ViTDet's recipe: a real data set (Pascal
# VOC's 16.5k, COCO's 118k, LVIS's 100k), where 100 epochs of large-scale jitter are a schedule of
# tens of thousands of steps at batch 64. (Counted as image files in the training split's folder.)
FULL_SCALE_IMAGES = 10_000
SIZE_SAMPLE = 64  # images whose size (read from the file header) sets the small-data recipes' img_size
SIDE_RANGE = (128, 1024)  # the img_size those recipes may choose: the shapes job's to ViTDet's
SIDE_STEP = 32  # img_size is rounded to a multiple of the pyramid's coarsest stride

# The shapes set's small-CPU recipe: a narrow, shallow WeightFormer (stride 16) behind a 64-channel
# pyramid, light RoI heads and few proposals, at 128 px, flips without scale jitter (no_aug), sized for
# about 8 minutes on 2 CPU cores (docs/dense.md: bbox mAP 47.3). Learning rates are per total batch of
# 512, as everywhere: 1.25e-3 at batch 4.
_SHAPES_MODEL_KWARGS = {"embed_dim": 64, "depth": 4, "conv_dim": 64, "fc_dim": 128, "rpn_pre_nms_top_n_train": 300,
                        "rpn_post_nms_top_n_train": 64, "rpn_pre_nms_top_n_test": 150, "rpn_post_nms_top_n_test": 50,
                        "box_batch_size_per_image": 32}
# The detector is the torchvision protocol's: from scratch at 128 px it reached 47.3 bbox mAP against the
# vitdet protocol's 31.3 (docs/dense.md; most of the gap is the RoI heads': aligned pooling, L1 boxes).
_SHAPES_SCHEDULE = {"epochs": 16, "batch_size": 4, "lr": 0.16, "min_lr": 1.6e-3, "warmup_lr": 1.6e-3,
                    "warmup_epochs": 1, "weight_decay": 0.05, "no_aug": True, "det_protocol": "torchvision"}
OFFLINE = Recipe("offline", "the shapes set's small-CPU recipe (WeightFormer 64-d x 4 blocks, 128 px, 16 epochs at "
                            "batch 4, flips only)", {
    "model": "weightformer_tiny", "model_kwargs": _SHAPES_MODEL_KWARGS, "img_size": 128, **_SHAPES_SCHEDULE,
    "workers": 0,  # 128 px images decode and flip faster than worker processes start
})

# ViTDet's COCO recipe (Li et al., 2022), as configs/coco_cascade_maskrcnn_weightformer_t_lsj_100ep.yaml has
# it (see there): 8 images per GPU (batch 64 on 8 GPUs), lr 1e-4 at batch 64 (per 512: 8e-4), weight decay
# 0.1, layer decay 0.7 over 12 blocks (0.777 over WeightFormer's 17), drop path 0.1, LSJ to 1024², 100
# epochs, x0.1 at 88.9% and 96.3%, 250 warm-up steps (0.136 epochs at batch 64), and its detector
# (det_protocol vitdet). Large-scale jitter (det_resize lsj) and flips with probability 0.5 are the
# config's own defaults.
VITDET = Recipe("vitdet-coco", "ViTDet's COCO recipe (100 epochs of large-scale jitter at 1024², 8 images per GPU, "
                               "lr 1e-4 at batch 64, layer decay 0.777)", {
    "model": "weightformer_tiny", "model_kwargs": {"drop_path_rate": 0.1}, "det_protocol": "vitdet", "img_size": 1024,
    "epochs": 100, "batch_size": 8, "lr": 8e-4, "min_lr": 0.0, "warmup_lr": 8e-7, "warmup_epochs": 0.136,
    "weight_decay": 0.1, "layer_decay": 0.777, "sched": "multistep", "decay_milestones": (88.9, 96.3),
    "decay_rate": 0.1, "clip_grad": None,
})

# From scratch on a folder of one's own: the shapes recipe, whose model and rates learn from scratch,
# with img_size set to the folder's images (choose_recipe) and the default data-loading workers (photos
# decode slower than the shapes' small PNGs).
SMALL_DATA = Recipe("small-data", "the shapes recipe from scratch (WeightFormer 64-d x 4 blocks, 16 epochs at batch "
                                  "4, flips only) at the size of the folder's images", {
    "model": "weightformer_tiny", "model_kwargs": _SHAPES_MODEL_KWARGS, "img_size": 128, **_SHAPES_SCHEDULE,
})

# Fine-tuning --init weights on fewer images than ViTDet's recipe needs: the --init backbone as it is
# (no architecture kwargs, so its weights fit) behind the detector's full-size pyramid and heads, ViTDet's
# regularisation and detector (drop path 0.1, weight decay 0.1, layer decay 0.777, large-scale jitter,
# det_protocol vitdet) over 24 epochs
# at batch 4, lr 1e-4 at batch 4 (per 512: 1.28e-2; AdamW at small batches takes about ViTDet's rate).
FINE_TUNE = Recipe("fine-tune", "fine-tune the --init backbone: 24 epochs at batch 4, lr 1e-4, large-scale jitter, "
                                "layer decay 0.777, at the size of the folder's images", {
    "model_kwargs": {"drop_path_rate": 0.1}, "det_protocol": "vitdet", "img_size": 1024, "epochs": 24, "batch_size": 4,
    "lr": 1.28e-2,
    "min_lr": 1.28e-4, "warmup_lr": 1.28e-5, "warmup_epochs": 1, "weight_decay": 0.1, "layer_decay": 0.777,
})

RECIPES = (OFFLINE, VITDET, SMALL_DATA, FINE_TUNE)


def image_side(image_dir: Path, sample: int = SIZE_SAMPLE) -> Optional[int]:
    """The median long side of the first ``sample`` images under ``image_dir`` (in name order), rounded
    to a multiple of :data:`SIDE_STEP` and kept in :data:`SIDE_RANGE`; None if none can be read. Only
    the file headers are read."""
    from ..data.images import image_sizes  # imports torch: not at the top, so the CLI starts without it

    sides = [max(size) for size in image_sizes(image_dir, sample)]
    if not sides:
        return None
    side = SIDE_STEP * round(statistics.median(sides) / SIDE_STEP)
    return min(max(side, SIDE_RANGE[0]), SIDE_RANGE[1])


def _sized(recipe: Recipe, side: Optional[int]) -> Recipe:
    return Recipe(recipe.name, recipe.summary, {**recipe.values, "img_size": side}) if side else recipe


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring: the offline job's for shapes; for a folder, by its number of training
    images and ``--init``. A folder that is no COCO layout is one DataError line (:func:`find_split`)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS  # torch and torchvision: not at the top, so the CLI

    from .layout import find_split  # starts without them

    if data == synthetic.SHAPES_NAME:
        return RecipeChoice(OFFLINE, f"{data} is the offline data set")
    root = Path(data).expanduser()
    image_dir = find_split(root, "train", settings.get("train_split")).image_dir
    images = count_files(image_dir, IMG_EXTENSIONS)
    init = settings.get("init")
    counted = f"{image_dir} holds {images} training images"
    if init and images >= FULL_SCALE_IMAGES:
        return RecipeChoice(VITDET, f"{counted} (at least {FULL_SCALE_IMAGES}) and --init gives a pretrained backbone")
    side = image_side(image_dir)
    size = f"; img_size {side}, the median long side of its images" if side else ""
    if init:
        return RecipeChoice(_sized(FINE_TUNE, side), f"{counted}, fewer than the {FULL_SCALE_IMAGES} ViTDet's recipe "
                                                     f"needs, and --init gives a backbone to fine-tune{size}")
    need = "" if images >= FULL_SCALE_IMAGES else f" and at least {FULL_SCALE_IMAGES} images"
    return RecipeChoice(_sized(SMALL_DATA, side), f"{counted} and there is no --init: ViTDet's recipe needs a "
                                                  f"pretrained backbone (--init){need}, so the model learns from "
                                                  f"scratch{size}")
