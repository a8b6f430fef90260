"""Detection's recipes (``configs/detection/``) and the rule that picks one: the offline job's for shapes; for a
COCO-layout folder, ViTDet's COCO recipe when ``--init`` gives a backbone and there are :data:`FULL_SCALE_IMAGES`
training images, else fine-tuning ``--init``, else learning from scratch, both sized to the folder's images."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Mapping, Optional

from ..engine.recipes import Recipe, RecipeChoice, count_files, load_recipe, median_side
from . import synthetic

__all__ = ["FULL_SCALE_IMAGES", "choose_recipe", "image_side", "recipe", "recipes"]

FULL_SCALE_IMAGES = 10_000  # (VOC: 16.5k, COCO: 118k) 100 epochs of LSJ are then tens of thousands of steps
SIZE_SAMPLE = 64  # images whose size (read from the file header) sets the small-data recipes' img_size
SIDE_RANGE = (128, 1024)  # the img_size those recipes may choose: the shapes job's to ViTDet's
SIDE_STEP = 32  # img_size is rounded to a multiple of the pyramid's coarsest stride
COCO = "coco_cascade_maskrcnn_weightformer_t_lsj_100ep.yaml"


recipe = partial(load_recipe, task="detection")


def recipes() -> tuple[Recipe, ...]:
    return tuple(map(recipe, ("shapes.yaml", COCO, "small-data.yaml", "fine-tune.yaml")))


def image_side(image_dir: Path, sample: int = SIZE_SAMPLE) -> Optional[int]:
    """The median long side of the first ``sample`` images under ``image_dir`` (in name order), rounded
    to a multiple of :data:`SIDE_STEP` and kept in :data:`SIDE_RANGE`; None if none can be read."""
    median = median_side(image_dir, sample, max)
    if median is None:
        return None
    side = SIDE_STEP * round(median / SIDE_STEP)
    return min(max(side, SIDE_RANGE[0]), SIDE_RANGE[1])


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring. A folder that is no COCO layout is one DataError line (:func:`find_split`)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS  # torch and torchvision: not at the top, so the CLI

    from .layout import find_split  # starts without them

    if data == synthetic.SHAPES_NAME:
        return RecipeChoice(recipe("shapes.yaml"), f"{data} is the offline data set")
    image_dir = find_split(Path(data).expanduser(), "train", settings.get("train_split")).image_dir
    images = count_files(image_dir, IMG_EXTENSIONS)
    init = settings.get("init")
    counted = f"{image_dir} holds {images} training images"
    if init and images >= FULL_SCALE_IMAGES:
        return RecipeChoice(recipe(COCO), f"{counted} (at least {FULL_SCALE_IMAGES}) and --init gives a pretrained "
                                          f"backbone")
    side = image_side(image_dir)
    sized = {"img_size": side} if side else {}
    size = f"; img_size {side}, the median long side of its images" if side else ""
    if init:
        return RecipeChoice(recipe("fine-tune.yaml").sized(**sized),
                            f"{counted}, fewer than the {FULL_SCALE_IMAGES} ViTDet's recipe needs, and --init gives a "
                            f"backbone to fine-tune{size}")
    need = "" if images >= FULL_SCALE_IMAGES else f" and at least {FULL_SCALE_IMAGES} images"
    return RecipeChoice(recipe("small-data.yaml").sized(**sized),
                        f"{counted} and there is no --init: ViTDet's recipe needs a pretrained backbone (--init)"
                        f"{need}, so the model learns from scratch{size}")
