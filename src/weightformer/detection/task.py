"""Detection as a whole task: COCO-layout data (COCO 2017 as downloaded, other split names, or the offline
``shapes`` set), Mask R-CNN or Cascade Mask R-CNN on a timm backbone behind ViTDet's simple feature
pyramid, COCO box and mask AP, and ``weightformer det train|eval|predict``.

:class:`DetectionTask` is what :func:`weightformer.engine.train` runs (``task=DetectionTask``): its
settings are :class:`~weightformer.detection.config.DetectionConfig`, its recipes those of
:mod:`weightformer.detection.recipes`. :func:`training_loss` is the loss of a batch;
:func:`build_detector` rebuilds a model from a checkpoint's ``meta``.

``model_kwargs`` go to the timm backbone, ``detector_kwargs`` (``conv_dim``, ``fc_dim`` and torchvision's
``rpn_*``, ``box_*`` and ``bbox_*`` options) to :func:`build_maskrcnn`.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from ..checkpoint import CheckpointError
from ..data.errors import DataError
from ..engine.device import autocast
from ..engine.errors import ConfigError, model_arguments_checked
from ..engine.recipes import Recipe, RecipeChoice
from ..engine.task import Command, Task, TaskData
from . import recipes, synthetic
from .config import LEGACY_FALLBACK_PROTOCOL, DetectionConfig, split_model_kwargs

if TYPE_CHECKING:  # the training code below imports them where it runs: the command line needs none of them
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader

    from ..engine.distributed import DistInfo
    from .data import CocoDetection, Target

__all__ = ["BACKBONE_PATH", "DEFAULT_IMG_SIZE", "DetectionTask", "build_detector", "training_loss"]

DEFAULT_IMG_SIZE = 1024  # ViTDet's: LSJ crops of 1024², and the model's min and max size
LSJ_SCALES = (0.1, 2.0)  # ViTDet's large-scale jitter range
BACKBONE_PATH = "backbone.backbone"  # the timm model inside the detector (Mask R-CNN -> SimpleFeaturePyramid)


def training_loss(model: nn.Module, batch: tuple[list[Tensor], list[Target]],
                  device: torch.device) -> tuple[Tensor, dict[str, Tensor]]:
    """The summed loss of a collated batch, and each detached term (RPN, box stages, mask) to log.
    Crowd regions are left out of the targets."""
    from .data import drop_crowd

    images, targets = batch
    images = [image.to(device, non_blocking=True) for image in images]
    targets = [{k: v.to(device, non_blocking=True) for k, v in drop_crowd(t).items()} for t in targets]
    losses = model(images, targets)
    return sum(losses.values()), {k: v.detach() for k, v in losses.items()}


def build_detector(meta: Mapping[str, Any]) -> nn.Module:
    """The detector a checkpoint's ``meta`` describes (backbone name and kwargs, categories, cascade,
    protocol, size), randomly initialised. A keyword or value the builders refuse is a ConfigError.
    A checkpoint saved before the protocol setting has no ``protocol``: it was trained as the
    ``torchvision`` protocol builds the detector."""
    from ..models.pyramid import build_backbone
    from .model import build_maskrcnn, detection_pyramid

    conv_dim = inspect.signature(build_maskrcnn).parameters["conv_dim"].default
    if "detector_kwargs" in meta:
        backbone_kwargs, detector_kwargs = dict(meta["model_kwargs"]), dict(meta["detector_kwargs"])
    else:  # a checkpoint saved with one mapping for both
        backbone_kwargs, detector_kwargs = split_model_kwargs(meta["model_kwargs"])
    protocol = meta.get("protocol", LEGACY_FALLBACK_PROTOCOL)
    what = f"a {'cascade ' if meta['cascade'] else ''}Mask R-CNN on {meta['model']}"
    with model_arguments_checked(what, {**backbone_kwargs, **detector_kwargs}):
        backbone = build_backbone(meta["model"], **backbone_kwargs)
        pyramid = detection_pyramid(backbone, detector_kwargs.get("conv_dim", conv_dim), protocol)
        return build_maskrcnn(pyramid, meta["num_classes"] + 1, cascade=meta["cascade"], protocol=protocol,
                              min_size=meta["img_size"], max_size=meta.get("max_size", meta["img_size"]),
                              **detector_kwargs)


def _class_names(dataset: CocoDetection, num_classes: int) -> list[str]:
    """The category names (no background), padded with class<i> up to ``num_classes``."""
    names = dataset.class_names[1:]
    return names + [f"class{i}" for i in range(len(names) + 1, num_classes + 1)]


def _percent(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.2f}"


class DetectionTask(Task):
    """Train a Mask R-CNN (or, with ``cascade``, a Cascade Mask R-CNN) on COCO-layout data.

    ``det_resize`` picks the image sizes, for training and evaluation:

    - ``lsj`` (ViTDet's): training images get large-scale jitter to ``img_size``² crops (with
      ``no_aug``, no scale jitter: each image fits the square as it is); the model resizes every image
      so its long side is ``img_size``.
    - ``shortest_edge`` (the 1× schedule's): the model resizes every image so its short side is
      ``img_size`` and its long side at most ``det_max_size``; training adds only flips.

    Flips have probability ``hflip``; all randomness is seeded by (seed, epoch, index).
    ``num_classes`` counts the categories (None: the annotation file's). The splits are
    ``train_split`` and ``val_split`` (None: found in the folder, see
    :func:`~weightformer.detection.data.find_split`).
    """

    name = "detection"
    cli_name = "det"
    description = ("Detection and instance segmentation: Mask R-CNN and Cascade Mask R-CNN on a timm backbone, on "
                   "COCO-layout data (COCO 2017 as downloaded) or the offline shapes set.")
    config_class = DetectionConfig
    output_prefix = "det_"
    best_metric = "bbox_mAP"
    curve_metrics = ("bbox_mAP", "bbox_mAP_50", "segm_mAP")
    backbone_path = BACKBONE_PATH

    cfg: DetectionConfig

    # ---------------------------------------------------------------------------------------------
    # The task as a whole
    # ---------------------------------------------------------------------------------------------
    @classmethod
    def recipes(cls) -> Sequence[Recipe]:
        return recipes.recipes()

    @classmethod
    def choose_recipe(cls, data: str, settings: Mapping[str, Any]) -> RecipeChoice:
        return recipes.choose_recipe(data, settings)

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        return build_detector(meta)

    @classmethod
    def commands(cls) -> Sequence[Command]:
        from .cli import COMMANDS

        return COMMANDS

    @classmethod
    def add_train_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--visualize", type=int, default=0, metavar="N",
                            help="after training, draw the detections on N validation images into OUTPUT/visualize/ "
                                 "(default: 0)")

    @classmethod
    def check_train_arguments(cls, args: argparse.Namespace) -> None:
        if args.visualize < 0:
            raise ConfigError(f"--visualize must be 0 or more images, got {args.visualize}")

    @classmethod
    def after_training(cls, result: Any, args: argparse.Namespace) -> None:
        """``--visualize N``: the trained model's detections on the first N validation images (drawn once,
        by the first process under torchrun)."""
        if not args.visualize or int(os.environ.get("RANK", "0")) != 0:
            return
        from ..engine.weights import read_checkpoint
        from .evaluation import val_dataset
        from .visualize import save_visualizations

        ckpt = read_checkpoint(result.last_checkpoint)
        meta, val_split = ckpt["meta"], ckpt["config"].get("val_split")
        out = Path(result.output) / "visualize"
        paths = save_visualizations(result.model, val_dataset(meta["data"], run_split=val_split), out, args.visualize,
                                    ["__background__", *meta["classes"]], next(result.model.parameters()).device)
        print(f"drew the detections on {len(paths)} val image(s) in {out}")

    # ---------------------------------------------------------------------------------------------
    # Training
    # ---------------------------------------------------------------------------------------------
    def __init__(self, cfg: DetectionConfig):
        super().__init__(cfg)
        self.img_size = cfg.img_size or DEFAULT_IMG_SIZE
        self.val_set: Optional[CocoDetection] = None
        self.num_classes = 0

    def build_data(self, dist_info: DistInfo) -> TaskData:
        from .data import CocoDetection, LargeScaleJitter, RandomFlip, SeededJitterDataset, collate, data_root, find_split

        cfg = self.cfg
        root = data_root(cfg.data)
        train_split, val_split = find_split(root, "train", cfg.train_split), find_split(root, "val", cfg.val_split)
        train, val = CocoDetection(root, train_split.name), CocoDetection(root, val_split.name)
        if train.coco.cats != val.coco.cats:
            raise DataError(f"{root}: the {train.split} and {val.split} annotation files declare different categories; "
                            "both must list the same ones")
        if not any(val.coco.getAnnIds(imgIds=val.image_ids, iscrowd=False)):
            raise DataError(f"{val.annotation_file} has no annotated object, so there is no AP to measure; "
                            "the val split needs annotations")
        categories = len(train.category_ids)
        self.num_classes = cfg.num_classes if cfg.num_classes is not None else categories
        if self.num_classes < categories:
            raise ConfigError(f"num_classes {self.num_classes} is fewer than the {categories} categories of "
                              f"{train.annotation_file}; drop --num-classes to use the file's")
        self.val_set = val
        if cfg.det_resize == "lsj":
            scales = (1.0, 1.0) if cfg.no_aug else LSJ_SCALES
            augment: Any = LargeScaleJitter(self.img_size, scales, flip=cfg.hflip)
            sizes = f"{'flips' if cfg.no_aug else 'large-scale jitter'} to {self.img_size}² crops"
        else:
            augment = RandomFlip(cfg.hflip)
            sizes = f"flips, short side {self.img_size} and long side at most {cfg.det_max_size}"
        train_set = SeededJitterDataset(train, augment, seed=cfg.seed)
        description = (f"data {cfg.data}: {len(train)} train ({train.split}) / {len(val)} val ({val.split}) images, "
                       f"{categories} categories, {sizes}")
        return TaskData(train_set, val, description, collate_fn=collate)

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        cfg, val = self.cfg, self.val_set
        assert val is not None, "build_data comes first"
        meta = {
            "task": self.name, "model": cfg.model, "model_kwargs": dict(cfg.model_kwargs),
            "detector_kwargs": dict(cfg.detector_kwargs), "num_classes": self.num_classes, "classes": _class_names(val, self.num_classes), "cascade": cfg.cascade,
            "protocol": cfg.det_protocol,
            "img_size": self.img_size,
            "max_size": cfg.det_max_size if cfg.det_resize == "shortest_edge" else self.img_size,
            "data": cfg.data if cfg.data == synthetic.SHAPES_NAME else str(Path(cfg.data).expanduser().resolve()),
        }
        return build_detector(meta).to(device), meta

    def check_checkpoint(self, meta: dict[str, Any], source: str, resuming: bool = True) -> None:
        for key, flag in (("num_classes", "--num-classes"), ("cascade", "--cascade")):
            mine = self.num_classes if key == "num_classes" else self.cfg.cascade
            if meta.get(key) != mine:
                raise CheckpointError(f"{source} has {key} {meta.get(key)} and this run {mine}; pass {flag} to "
                                      f"match it{', or start a new run' if resuming else ''}")

    def training_loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        loss, _ = training_loss(model, batch, device)
        return loss, len(batch[0])

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, Any]:
        from .evaluation import METRIC_NAMES, evaluate

        with autocast(device, amp):
            metrics = evaluate(model, loader, loader.dataset, device, dist_info)  # type: ignore[arg-type]
        result: dict[str, Any] = {name: None if math.isnan(metrics[name]) else metrics[name] for name in METRIC_NAMES}
        result["images"] = int(metrics["num_images"])
        return result

    def summary(self, metrics: dict[str, Any]) -> str:
        return (f"bbox mAP {_percent(metrics['bbox_mAP'])} (AP50 {_percent(metrics['bbox_mAP_50'])}), "
                f"mask mAP {_percent(metrics['segm_mAP'])} ({metrics['images']} images)")

    def format_score(self, value: float) -> str:
        return f"bbox mAP {value:.2f}"
