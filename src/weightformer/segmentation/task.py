"""Segmentation as a task: ADE20K-layout data (or the offline ``shapes`` set), an UperNet on a timm backbone
(commands: :mod:`.cli`); ``--img-size`` is the training crop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..checkpoint import CheckpointError
from ..engine.errors import model_arguments_checked
from ..engine.task import Task, TaskData
from .cli import CLI
from .config import SegmentationConfig

if TYPE_CHECKING:  # imported where they run: the command line needs none of them
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader

    from ..engine.distributed import DistInfo
    from .data import SegmentationBatch

__all__ = ["BACKBONE_PATH", "SegmentationTask", "build_segmenter", "training_loss"]

BACKBONE_PATH = "pyramid.backbone"  # the timm model inside the segmenter (UperNet -> either protocol's pyramid)


def _cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    import torch.nn.functional as F

    from .data import IGNORE_INDEX

    # mmseg's: the mean over every pixel, ignored ones adding 0 (avg_non_ignore=False), never NaN on an ignored crop
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="none").mean()


def training_loss(model: nn.Module, batch: SegmentationBatch, device: torch.device,
                  aux_weight: float = 0.4) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of a batch (cross-entropy plus ``aux_weight`` times the auxiliary head's, if the UperNet has that
    head) and each detached term to log: ``decode`` and ``aux``."""
    images, labels = batch.images.to(device, non_blocking=True), batch.labels.to(device, non_blocking=True)
    logits, aux_logits = model(images, with_aux=True)  # (B, K, H, W) each; model may be DDP-wrapped
    terms = {"decode": _cross_entropy(logits, labels)}
    if aux_logits is not None:
        terms["aux"] = aux_weight * _cross_entropy(aux_logits, labels)
    return sum(terms.values()), {name: term.detach() for name, term in terms.items()}


def build_segmenter(meta: Mapping[str, Any]) -> nn.Module:
    """The UperNet of a checkpoint's ``meta``; ``model_kwargs`` holds the head's widths, the vim protocol's
    ``out_indices`` and the backbone's timm arguments (a keyword neither takes is a ConfigError)."""
    from .model import build_upernet

    kwargs, protocol = meta["model_kwargs"], meta["protocol"]
    with model_arguments_checked(f"an UperNet on {meta['model']} ({protocol} protocol)", kwargs,
                                 " or the --config file's model_kwargs (head widths: channels, pyramid_channels, "
                                 "aux_channels, pool_scales; the vim protocol's out_indices)"):
        return build_upernet(meta["model"], meta["num_classes"], protocol=protocol, **kwargs)


class SegmentationTask(Task):
    """Train an UperNet (on a timm backbone's pyramid, by ``seg_protocol``) on ADE20K-layout data with
    mmseg's ADE20K pipeline scaled to ``img_size``; evaluation resizes the short side to ``img_size`` and
    predicts whole images or sliding windows (``seg_inference``)."""

    name = "segmentation"
    config_class = SegmentationConfig
    recipes_module = "weightformer.segmentation.recipes"
    output_prefix = "seg_"
    best_metric = "mIoU"
    curve_metrics = ("mIoU", "mAcc", "aAcc")
    backbone_path = BACKBONE_PATH
    cli = CLI

    cfg: SegmentationConfig

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        return build_segmenter(meta)

    @classmethod
    def upgrade_checkpoint(cls, checkpoint: dict[str, Any], version: int) -> dict[str, Any]:
        """Format 0 may name no protocol: such runs were trained on the simple pyramid."""
        from ..engine.weights import with_missing
        from ..models.weightformer_long_range import name_unversioned_predictor

        return name_unversioned_predictor(with_missing(checkpoint, {"protocol": "simple-pyramid"},
                                                       {"seg_protocol": "simple-pyramid"}))

    def __init__(self, cfg: SegmentationConfig):
        super().__init__(cfg)
        self.img_size = cfg.img_size or 512

    def param_groups(self, model: nn.Module) -> Optional[list[dict[str, Any]]]:
        """The engine's layer-decay groups; under ``seg_layer_decay`` stem-only, every group but the stem's (the
        lowest rate) at the full rate."""
        groups = super().param_groups(model)
        if groups is not None and self.cfg.seg_layer_decay == "stem-only":
            stem = min(group["lr_scale"] for group in groups)
            for group in groups:
                group["lr_scale"] = stem if group["lr_scale"] == stem else 1.0
        return groups

    def build_data(self, dist_info: DistInfo) -> TaskData:
        from .data import SegmentationFolder, TrainTransform, class_names, collate_segmentation, find_root, folder_classes
        from .evaluation import eval_transform

        cfg = self.cfg
        root = find_root(cfg.data)
        num_classes, counted = cfg.num_classes, ""
        if num_classes is None:
            classes = folder_classes(cfg.data, root, cfg.reduce_zero_label)
            num_classes, counted = classes.count, f"{classes.source}; "
        names = class_names(cfg.data, root, cfg.reduce_zero_label)
        train_tf = TrainTransform(crop_size=self.img_size, scale=(4 * self.img_size, self.img_size), hflip=cfg.hflip,
                                  photometric=not cfg.no_aug)
        common = dict(reduce_zero_label=cfg.reduce_zero_label, num_classes=num_classes, verify=cfg.verify_images)
        train_set = SegmentationFolder(root, "training", transform=train_tf, seed=cfg.seed, **common)
        val_set = SegmentationFolder(root, "validation", transform=eval_transform(self.img_size), **common)
        description = (f"data {cfg.data}: {len(train_set)} train / {len(val_set)} val images, {num_classes} "
                       f"classes ({counted}{'reduce-zero-label' if cfg.reduce_zero_label else 'label 0 is a class'}), "
                       f"{self.img_size} px crops, {cfg.seg_inference} inference")
        meta = {"num_classes": num_classes, "classes": names if names is not None and len(names) == num_classes
                else None}
        return TaskData(train_set, val_set, description, collate_fn=collate_segmentation, meta=meta)

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        import torch.distributed as dist
        from torch import nn

        cfg = self.cfg
        meta = {
            "task": self.name, "model": cfg.model, "model_kwargs": dict(cfg.model_kwargs), "protocol": cfg.seg_protocol,
            "reduce_zero_label": cfg.reduce_zero_label, "img_size": self.img_size, "data": cfg.data, **data.meta,
        }
        model = build_segmenter(meta)
        if device.type == "cuda" and dist.is_initialized() and dist.get_world_size() > 1:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # mmseg's SyncBN: statistics over every process
        return model.to(device), meta

    def check_checkpoint(self, saved: Mapping[str, Any], meta: Mapping[str, Any], source: str,
                         resuming: bool = True) -> None:
        if saved.get("num_classes") not in (None, meta["num_classes"]):
            raise CheckpointError(f"{source} has {saved['num_classes']} classes and this run {meta['num_classes']}; "
                                  f"pass --num-classes {saved['num_classes']} or the data it was trained on "
                                  f"({saved.get('data')})")

    def training_loss(self, model: nn.Module, batch: SegmentationBatch, device: torch.device) -> tuple[Tensor, int]:
        loss, _ = training_loss(model, batch, device)
        return loss, batch.images.shape[0]

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, float]:
        from .evaluation import evaluate

        cfg = self.cfg
        num_classes = loader.dataset.num_classes  # type: ignore[attr-defined]
        result = evaluate(model, loader, num_classes, device, cfg.seg_inference, cfg.seg_crop, cfg.seg_stride, amp)
        return {"mIoU": result["mIoU"], "mAcc": result["mAcc"], "aAcc": result["aAcc"],
                "images": len(loader.dataset)}  # type: ignore[arg-type]
