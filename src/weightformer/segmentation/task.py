"""Segmentation as a task: ADE20K-layout data (or the offline ``shapes`` set), an UperNet on a timm
backbone, its recipes, and ``weightformer seg train|eval|predict``.

:class:`SegmentationTask` plugs the data and the model into :func:`weightformer.engine.train`;
``--img-size`` is the training crop.

The loss is mmseg's: pixel-wise cross-entropy averaged over all pixels of the batch (ignored ones
add zero), plus ``aux_weight`` times the same loss on the auxiliary head's logits. Evaluation is
:mod:`.evaluation`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..checkpoint import CheckpointError
from ..engine.errors import model_arguments_checked
from ..engine.recipes import Recipe, RecipeChoice
from ..engine.task import Command, Task, TaskData
from . import recipes
from .config import SegmentationConfig

if TYPE_CHECKING:  # the training code below imports them where it runs: the command line needs none of them
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

    # mean over every pixel, ignored ones included (mmseg's avg_non_ignore=False): never NaN on an all-ignored crop
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="none").mean()


def training_loss(
    model: nn.Module, batch: SegmentationBatch, device: torch.device, aux_weight: float = 0.4
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of a batch (main cross-entropy plus ``aux_weight`` times the auxiliary one, if the model
    has that head) and each detached term to log: ``decode`` and ``aux``. ``model`` is an
    :class:`~weightformer.models.upernet.UperNet`, possibly wrapped in DistributedDataParallel."""
    images = batch.images.to(device, non_blocking=True)
    labels = batch.labels.to(device, non_blocking=True)
    logits, aux_logits = model(images, with_aux=True)  # (B, K, H, W) each; model may be DDP-wrapped
    terms = {"decode": _cross_entropy(logits, labels)}
    if aux_logits is not None:
        terms["aux"] = aux_weight * _cross_entropy(aux_logits, labels)
    return sum(terms.values()), {name: term.detach() for name, term in terms.items()}


# --------------------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------------------


def build_segmenter(meta: Mapping[str, Any]) -> nn.Module:
    """The UperNet of a checkpoint's ``meta``: ``build_upernet(meta["model"], meta["num_classes"],
    protocol=meta["protocol"], **meta["model_kwargs"])``.

    ``protocol`` is the run's ``seg_protocol``; a checkpoint written before it existed holds none and
    rebuilds as the simple pyramid it was trained with. ``model_kwargs`` holds the head's widths
    (``channels``, ``pyramid_channels``, ``aux_channels``, ``pool_scales``), the vim protocol's
    ``out_indices`` and the backbone's timm arguments. A keyword neither takes, or a value the model
    refuses, is a :class:`ConfigError`.
    """
    from .model import build_upernet

    kwargs = meta["model_kwargs"]
    protocol = meta.get("protocol", "simple-pyramid")
    with model_arguments_checked(f"an UperNet on {meta['model']} ({protocol} protocol)", kwargs,
                                 " (head widths: channels, pyramid_channels, aux_channels, pool_scales; "
                                 "the vim protocol's out_indices)"):
        return build_upernet(meta["model"], meta["num_classes"], protocol=protocol, **kwargs)


class SegmentationTask(Task):
    """Train an UperNet (on a timm backbone's pyramid, by ``seg_protocol``) on ADE20K-layout data.

    Training uses mmseg's ADE20K pipeline scaled to ``img_size`` (random resize of the short side
    to 0.5-2x img_size, an img_size crop, flip, photometric distortion); evaluation resizes the
    short side to img_size and predicts whole images or sliding windows (``seg_inference``).
    """

    name = "segmentation"
    cli_name = "seg"
    description = "Semantic segmentation: UperNet on a WeightFormer (or any timm) backbone, ADE20K-layout data."
    config_class = SegmentationConfig
    output_prefix = "seg_"
    best_metric = "mIoU"
    curve_metrics = ("mIoU", "mAcc", "aAcc")
    backbone_path = BACKBONE_PATH

    cfg: SegmentationConfig

    @classmethod
    def recipes(cls) -> Sequence[Recipe]:
        return recipes.recipes()

    @classmethod
    def choose_recipe(cls, data: str, settings: Mapping[str, Any]) -> RecipeChoice:
        return recipes.choose_recipe(data, settings)

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        return build_segmenter(meta)

    @classmethod
    def commands(cls) -> Sequence[Command]:
        from .cli import COMMANDS

        return COMMANDS

    def __init__(self, cfg: SegmentationConfig):
        super().__init__(cfg)
        self.img_size = cfg.img_size or 512
        self.num_classes = cfg.num_classes  # None until build_data reads the data's own
        self.classes: list[str] | None = None
        self.distributed_cuda = False  # set by build_data: several CUDA processes share the batch statistics

    def build_data(self, dist_info: DistInfo) -> TaskData:
        from .data import SegmentationFolder, TrainTransform, class_names, collate_segmentation, find_root, folder_classes
        from .evaluation import eval_transform

        cfg = self.cfg
        self.distributed_cuda = dist_info.world_size > 1 and dist_info.device.type == "cuda"
        root = find_root(cfg.data)
        counted = ""
        if cfg.num_classes is None:
            classes = folder_classes(cfg.data, root, cfg.reduce_zero_label)
            self.num_classes, counted = classes.count, f"{classes.source}; "
        names = class_names(cfg.data, root, cfg.reduce_zero_label)
        self.classes = names if names is not None and len(names) == self.num_classes else None
        train_tf = TrainTransform(crop_size=self.img_size, scale=(4 * self.img_size, self.img_size), hflip=cfg.hflip,
                                  photometric=not cfg.no_aug)
        common = dict(reduce_zero_label=cfg.reduce_zero_label, num_classes=self.num_classes, verify=cfg.verify_images)
        train_set = SegmentationFolder(root, "training", transform=train_tf, seed=cfg.seed, **common)
        val_set = SegmentationFolder(root, "validation", transform=eval_transform(self.img_size), **common)
        description = (f"data {cfg.data}: {len(train_set)} train / {len(val_set)} val images, {self.num_classes} "
                       f"classes ({counted}{'reduce-zero-label' if cfg.reduce_zero_label else 'label 0 is a class'}), "
                       f"{self.img_size} px crops, {cfg.seg_inference} inference")
        return TaskData(train_set, val_set, description, collate_fn=collate_segmentation)

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        cfg = self.cfg
        assert self.num_classes is not None, "build_data comes first"
        meta = {
            "task": self.name, "model": cfg.model, "model_kwargs": dict(cfg.model_kwargs), "protocol": cfg.seg_protocol,
            "num_classes": self.num_classes, "reduce_zero_label": cfg.reduce_zero_label, "img_size": self.img_size,
            "data": cfg.data, "classes": self.classes,
        }
        model = build_segmenter(meta)
        if self.distributed_cuda:  # mmseg's SyncBN: batch statistics over every process's images (CUDA only)
            from torch import nn

            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return model.to(device), meta

    def check_checkpoint(self, meta: dict[str, Any], source: str, resuming: bool = True) -> None:
        if meta.get("num_classes") not in (None, self.num_classes):
            raise CheckpointError(f"{source} has {meta['num_classes']} classes and this run {self.num_classes}; "
                                  f"pass --num-classes {meta['num_classes']} or the data it was trained on "
                                  f"({meta.get('data')})")

    def training_loss(self, model: nn.Module, batch: SegmentationBatch, device: torch.device) -> tuple[Tensor, int]:
        loss, _ = training_loss(model, batch, device)
        return loss, batch.images.shape[0]

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, float]:
        from .evaluation import evaluate

        cfg = self.cfg
        result = evaluate(model, loader, self.num_classes, device, cfg.seg_inference, cfg.seg_crop, cfg.seg_stride, amp)
        return {"mIoU": result["mIoU"], "mAcc": result["mAcc"], "aAcc": result["aAcc"],
                "images": len(loader.dataset)}  # type: ignore[arg-type]

    def format_score(self, value: float) -> str:
        return f"mIoU {value:.2f}%"

    def summary(self, metrics: dict[str, Any]) -> str:
        return (f"mIoU {metrics['mIoU']:.2f}%, mAcc {metrics['mAcc']:.2f}%, aAcc {metrics['aAcc']:.2f}% "
                f"({metrics['images']} images)")
