"""Detection as a task: COCO-layout data (or the offline ``shapes`` set), Mask R-CNN or Cascade Mask R-CNN on
a timm backbone behind ViTDet's simple feature pyramid, COCO box and mask AP (commands: :mod:`.cli`)."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..checkpoint import CheckpointError
from ..data.errors import DataError
from ..engine.device import autocast
from ..engine.errors import ConfigError, model_arguments_checked
from ..engine.task import Task, TaskData
from . import synthetic
from .cli import CLI
from .config import LEGACY_FALLBACK_PROTOCOL, DetectionConfig, canvas_side, split_model_kwargs

if TYPE_CHECKING:  # imported where they run: the command line needs none of them
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader

    from ..engine.distributed import DistInfo
    from .data import Target

__all__ = ["BACKBONE_PATH", "DEFAULT_IMG_SIZE", "DetectionTask", "build_detector", "training_loss"]

DEFAULT_IMG_SIZE = 1024  # ViTDet's: LSJ crops of 1024², and the model's min and max size
LSJ_SCALES = (0.1, 2.0)  # ViTDet's large-scale jitter range
BACKBONE_PATH = "backbone.backbone"  # the timm model inside the detector (Mask R-CNN -> SimpleFeaturePyramid)


def training_loss(model: nn.Module, batch: tuple[list[Tensor], list[Target]],
                  device: torch.device) -> tuple[Tensor, dict[str, Tensor]]:
    """The summed loss of a collated batch (crowd regions left out), and each detached term to log."""
    from .data import drop_crowd

    images, targets = batch
    images = [image.to(device, non_blocking=True) for image in images]
    targets = [{k: v.to(device, non_blocking=True) for k, v in drop_crowd(t).items()} for t in targets]
    losses = model(images, targets)
    return sum(losses.values()), {k: v.detach() for k, v in losses.items()}


def build_detector(meta: Mapping[str, Any]) -> nn.Module:
    """The detector a checkpoint's ``meta`` describes, randomly initialised: ``model_kwargs`` go to the timm
    backbone, ``detector_kwargs`` to :func:`build_maskrcnn`; a keyword the builders refuse is a ConfigError."""
    from ..models.pyramid import build_backbone
    from .model import build_maskrcnn, detection_pyramid

    conv_dim = inspect.signature(build_maskrcnn).parameters["conv_dim"].default
    backbone_kwargs, extra = split_model_kwargs(meta["model_kwargs"])  # detector keys passed as --model-kwargs
    detector_kwargs = {**meta.get("detector_kwargs", {}), **extra}
    protocol = meta["protocol"]
    what = f"a {'cascade ' if meta['cascade'] else ''}Mask R-CNN on {meta['model']}"
    with model_arguments_checked(what, {**backbone_kwargs, **detector_kwargs}):
        backbone = build_backbone(meta["model"], **backbone_kwargs)
        pyramid = detection_pyramid(backbone, detector_kwargs.get("conv_dim", conv_dim), protocol)
        return build_maskrcnn(pyramid, meta["num_classes"] + 1, cascade=meta["cascade"], protocol=protocol,
                              min_size=meta["img_size"], max_size=meta.get("max_size", meta["img_size"]),
                              canvas=meta.get("canvas"), **detector_kwargs)


class DetectionTask(Task):
    """Train a Mask R-CNN (or, with ``cascade``, a Cascade Mask R-CNN) on COCO-layout data, resized as
    ``det_resize`` says (``no_aug``: no scale jitter); randomness is seeded by (seed, epoch, index)."""

    name = "detection"
    config_class = DetectionConfig
    recipes_module = "weightformer.detection.recipes"
    output_prefix = "det_"
    best_metric = "bbox_mAP"
    curve_metrics = ("bbox_mAP", "bbox_mAP_50", "segm_mAP")
    backbone_path = BACKBONE_PATH
    cli = CLI

    cfg: DetectionConfig

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        return build_detector(meta)

    @classmethod
    def upgrade_checkpoint(cls, checkpoint: dict[str, Any], version: int) -> dict[str, Any]:
        """Format 0 may name no protocol (such runs trained as ``torchvision``) and keeps the detector's settings
        inside ``model_kwargs``; formats 0 and 1 name no canvas (such runs padded each batch to a multiple of 32 of
        its largest image): they get the smallest canvas that holds their resized images."""
        from ..engine.weights import with_missing
        from ..models.weightformer_long_range import name_unversioned_predictor

        checkpoint = name_unversioned_predictor(with_missing(checkpoint, {"protocol": LEGACY_FALLBACK_PROTOCOL},
                                                             {"det_protocol": LEGACY_FALLBACK_PROTOCOL}))
        meta = checkpoint["meta"]
        if "detector_kwargs" not in meta:
            backbone, detector = split_model_kwargs(meta.get("model_kwargs") or {})
            meta = {**meta, "model_kwargs": backbone, "detector_kwargs": detector}
        if "canvas" not in meta and "img_size" in meta:
            meta = {**meta, "canvas": canvas_side(meta.get("max_size", meta["img_size"]))}
        return {**checkpoint, "meta": meta}

    def __init__(self, cfg: DetectionConfig):
        super().__init__(cfg)
        self.img_size = cfg.img_size or DEFAULT_IMG_SIZE
        self.max_size = cfg.det_max_size if cfg.det_resize == "shortest_edge" else self.img_size
        self.canvas = cfg.det_canvas or canvas_side(self.max_size)
        if self.canvas < self.max_size:
            raise ConfigError(f"det_canvas {self.canvas} is smaller than the resized images' long side "
                              f"{self.max_size}; pass --det-canvas {canvas_side(self.max_size)} or more, or drop it")

    def build_data(self, dist_info: DistInfo) -> TaskData:
        from .data import CocoDetection, collate
        from .layout import data_root, find_split
        from .transforms import LargeScaleJitter, RandomFlip, SeededJitterDataset

        cfg = self.cfg
        root = data_root(cfg.data)
        train_split, val_split = find_split(root, "train", cfg.train_split), find_split(root, "val", cfg.val_split)
        if train_split.name == val_split.name and dist_info.is_main:  # an overfitting check means it; others may not
            print(f"note: the run trains and evaluates on the one split {train_split.name}, so its AP measures how "
                  f"well it fits its training images, not how it generalises; pass another --val-split to measure that")
        train, val = CocoDetection(root, train_split.name), CocoDetection(root, val_split.name)
        if train.coco.cats != val.coco.cats:
            raise DataError(f"{root}: the {train.split} and {val.split} annotation files declare different categories; "
                            "both must list the same ones")
        empty = train.drop_unannotated()
        if not len(train):
            raise DataError(f"{train.annotation_file} has no image with an annotated object, so there is nothing to "
                            "learn; the train split needs annotations")
        if not any(val.coco.getAnnIds(imgIds=val.image_ids, iscrowd=False)):
            raise DataError(f"{val.annotation_file} has no annotated object, so there is no AP to measure; "
                            "the val split needs annotations")
        categories = len(train.category_ids)
        num_classes = cfg.num_classes if cfg.num_classes is not None else categories
        if num_classes < categories:
            raise ConfigError(f"num_classes {num_classes} is fewer than the {categories} categories of "
                              f"{train.annotation_file}; drop --num-classes to use the file's")
        if cfg.det_resize == "lsj":
            scales = (1.0, 1.0) if cfg.no_aug else LSJ_SCALES
            augment: Any = LargeScaleJitter(self.img_size, scales, flip=cfg.hflip)
            sizes = f"{'flips' if cfg.no_aug else 'large-scale jitter'} to {self.img_size}² crops"
        else:
            augment = RandomFlip(cfg.hflip)
            sizes = f"flips, short side {self.img_size} and long side at most {cfg.det_max_size}"
        train_set = SeededJitterDataset(train, augment, seed=cfg.seed)
        left_out = f", {empty} without objects left out" if empty else ""
        description = (f"data {cfg.data}: {len(train)} train ({train.split}{left_out}) / {len(val)} val ({val.split}) "
                       f"images, {categories} categories, {sizes}, padded to {self.canvas}²")
        names = val.class_names[1:]  # no background; padded with class<i> up to num_classes
        names += [f"class{i}" for i in range(len(names) + 1, num_classes + 1)]
        meta = {"num_classes": num_classes, "classes": names}
        return TaskData(train_set, val, description, collate_fn=collate, meta=meta)

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        cfg = self.cfg
        meta = {
            "task": self.name, "model": cfg.model, "model_kwargs": dict(cfg.model_kwargs),
            "detector_kwargs": dict(cfg.detector_kwargs), **data.meta,
            "cascade": cfg.cascade, "protocol": cfg.det_protocol, "img_size": self.img_size,
            "max_size": self.max_size, "canvas": self.canvas,
            "data": cfg.data if cfg.data == synthetic.SHAPES_NAME else str(Path(cfg.data).expanduser().resolve()),
        }
        return build_detector(meta).to(device), meta

    def check_checkpoint(self, saved: Mapping[str, Any], meta: Mapping[str, Any], source: str,
                         resuming: bool = True) -> None:
        for key, flag in (("num_classes", "--num-classes"), ("cascade", "--cascade")):
            if saved.get(key) != meta[key]:
                raise CheckpointError(f"{source} has {key} {saved.get(key)} and this run {meta[key]}; pass {flag} to "
                                      f"match it{', or start a new run' if resuming else ''}")

    def param_groups(self, model: nn.Module) -> Optional[list[dict[str, Any]]]:
        """The engine's groups (timm's: no decay on any 1-D parameter; ``lr_scale`` with ``layer_decay``); under
        a protocol with ``detectron2_heads`` (vitdet), split again as ViTDet's ``get_default_optimizer_params(
        weight_decay_norm=0)`` with ``pos_embed`` at 0: every parameter decays, biases too, but those of norm
        layers and position embeddings."""
        from torch import nn

        from .model import PROTOCOL_SETTINGS

        groups = super().param_groups(model)
        if not PROTOCOL_SETTINGS[self.cfg.det_protocol].detectron2_heads:
            return groups
        norms = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm)
        exempt = {id(p) for m in model.modules() if isinstance(m, norms) for p in m.parameters(recurse=False)}
        exempt |= {id(p) for n, p in model.named_parameters() if n.rpartition(".")[2] == "pos_embed"}
        split, decay = [], self.cfg.weight_decay
        for group in groups or [{"params": [p for p in model.parameters() if p.requires_grad]}]:
            for exempted in (False, True):
                params = [p for p in group["params"] if (id(p) in exempt) == exempted]
                if params:
                    split.append({**group, "params": params, "weight_decay": 0.0 if exempted else decay})
        return split

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
