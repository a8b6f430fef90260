"""Classification as a task: ImageFolder or built-in data with timm's transforms, any timm model,
Mixup/CutMix with smoothed cross-entropy, top-1/top-5 evaluation (commands: :mod:`.cli`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional

from ..checkpoint import CheckpointError
from ..engine.task import Task, TaskData
from . import recipes
from .cli import CLI
from .config import ClassificationConfig

if TYPE_CHECKING:  # imported where they run: the command line needs none of them
    import torch
    from timm.data import Mixup
    from torch import Tensor, nn
    from torch.utils.data import DataLoader, Dataset

    from ..engine.distributed import DistInfo

__all__ = ["ClassificationTask"]


class ClassificationTask(Task):
    """Train a timm classifier; validation uses the model's own evaluation preprocessing."""

    name = "classification"
    config_class = ClassificationConfig
    recipes_module = recipes.__name__
    best_metric = "top1"
    curve_metrics = ("top1", "top5")
    backbone_path = ""  # the classifier is its own backbone: --layer-decay decays its blocks
    cli = CLI

    cfg: ClassificationConfig

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        from .model import build_classifier

        return build_classifier(meta, pretrained=bool(meta.get("pretrained")))

    @classmethod
    def meta_for_weights(cls, checkpoint: str, state: Mapping[str, Tensor], model: Optional[str],
                         model_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The model the user named, with the class and channel counts of the weights' head and stem."""
        from .model import pretrained_cfg

        if model is None:
            raise CheckpointError(f"{checkpoint} does not say which model it holds; pass --model NAME")
        cfg = pretrained_cfg(model)
        meta: dict[str, Any] = {"task": cls.name, "model": model, "model_kwargs": dict(model_kwargs),
                                "num_classes": cfg.get("num_classes") or 1000, "in_chans": 3}
        head = state.get(f"{cfg.get('classifier', 'head')}.weight")
        if head is not None and head.dim() == 2:
            meta["num_classes"] = head.shape[0]  # (classes, features)
        stem = state.get(f"{cfg.get('first_conv', 'patch_embed.proj')}.weight")
        if stem is not None and stem.dim() == 4:
            meta["in_chans"] = stem.shape[1]  # (out, in_chans, kh, kw)
        return meta

    @classmethod
    def upgrade_checkpoint(cls, checkpoint: dict[str, Any], version: int) -> dict[str, Any]:
        from ..models.weightformer_long_range import name_unversioned_predictor

        return name_unversioned_predictor(checkpoint)

    def __init__(self, cfg: ClassificationConfig):
        from torch import nn

        super().__init__(cfg)
        self.img_size = cfg.img_size or 224
        self.mixup: Optional[Mixup] = None
        self.criterion: nn.Module = nn.CrossEntropyLoss()

    def build_data(self, dist_info: DistInfo) -> TaskData:
        from timm.data import Mixup
        from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

        from ..data import ArrayImageDataset, DataError, open_dataset, precompute
        from ..data.transforms import build_transforms, eval_data_config, seeded_transform
        from .model import pretrained_cfg

        cfg = self.cfg
        info, splits = open_dataset(cfg.data, verify=cfg.verify_images, warn=dist_info.is_main,
                                    split_names=cfg.split_names(), columns=(cfg.image_column, cfg.label_column))
        if info.num_classes < 2:
            raise DataError(f"{info.name} has one class ({info.classes[0]}), and a classifier needs at least two; "
                            f"add a subfolder per class to train/ and val/")
        eval_config = eval_data_config(pretrained_cfg(cfg.model), in_chans=info.in_chans, img_size=self.img_size,
                                       interpolation=cfg.interpolation, crop_pct=cfg.crop_pct, crop_mode=cfg.crop_mode,
                                       mean=info.mean, std=info.std)
        train_tf, val_tf = build_transforms(
            self.img_size, info.mean, info.std, train_scale=cfg.train_scale, hflip=cfg.hflip, no_aug=cfg.no_aug,
            color_jitter=cfg.color_jitter, auto_augment=cfg.auto_augment, reprob=cfg.reprob,
            interpolation=cfg.interpolation, crop_pct=cfg.crop_pct, crop_mode=eval_config["crop_mode"])
        train_set: Dataset = seeded_transform(splits["train"], train_tf, seed=cfg.seed)
        val_set: Dataset = seeded_transform(splits["val"], val_tf)
        if isinstance(splits["train"], ArrayImageDataset):  # small and in memory: transform once, not every epoch
            val_set = precompute(val_set)
            train_set = precompute(train_set) if cfg.no_aug else train_set
        if cfg.mixup > 0 or cfg.cutmix > 0:
            self.mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.smoothing,
                               num_classes=info.num_classes)
            self.criterion = SoftTargetCrossEntropy()  # Mixup returns smoothed soft targets
        elif cfg.smoothing > 0:
            self.criterion = LabelSmoothingCrossEntropy(smoothing=cfg.smoothing)
        description = (f"data {info.name}: {len(train_set)} train / {len(val_set)} val images at {self.img_size} px, "
                       f"{info.num_classes} classes")
        meta = {"num_classes": info.num_classes, "in_chans": info.in_chans, "data": info.name,
                "classes": list(info.classes), "mean": list(info.mean), "std": list(info.std),
                "crop_mode": eval_config["crop_mode"], "val_split": cfg.val_split,
                "columns": [cfg.image_column, cfg.label_column]}
        return TaskData(train_set, val_set, description, meta=meta)

    def model_kwargs(self) -> dict[str, Any]:
        """The user's kwargs, plus img_size for models whose position embeddings fix it (ViT, DeiT, WeightFormer)."""
        from .model import pretrained_cfg

        cfg = self.cfg
        kwargs = dict(cfg.model_kwargs)
        if cfg.model.startswith("weightformer") or pretrained_cfg(cfg.model).get("fixed_input_size", False):
            kwargs.setdefault("img_size", self.img_size)
        return kwargs

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        from .model import build_classifier, check_input_size

        cfg = self.cfg
        meta = {"task": self.name, "model": cfg.model, "model_kwargs": self.model_kwargs(), "img_size": self.img_size,
                "interpolation": cfg.interpolation, "crop_pct": cfg.crop_pct, **data.meta}
        model = build_classifier(meta).to(device)
        check_input_size(model, meta, device)
        return model, meta

    def check_checkpoint(self, saved: Mapping[str, Any], meta: Mapping[str, Any], source: str,
                         resuming: bool = True) -> None:
        if saved.get("in_chans") not in (None, meta["in_chans"]):
            raise CheckpointError(f"{source} was trained on {saved['in_chans']}-channel images and {meta['data']} has "
                                  f"{meta['in_chans']}-channel images; use data with {saved['in_chans']} channel(s), "
                                  f"or start a new run")
        if resuming and saved.get("num_classes") not in (None, meta["num_classes"]):
            raise CheckpointError(f"{source} has {saved['num_classes']} classes and {meta['data']} has "
                                  f"{meta['num_classes']}; resume on the data set it was trained on "
                                  f"({saved.get('data')})")

    def training_loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        images, targets = batch
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        if self.mixup is not None:
            images, targets = self.mixup(images, targets)  # targets: (B,) -> (B, num_classes) soft labels
        # The loss in float32, as CUDA's autocast runs it: CPU autocast leaves log_softmax (in timm's label-smoothing
        # and soft-target losses) in bf16, which rounds the loss to 3 significant digits.
        return self.criterion(model(images).float(), targets), images.shape[0]

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, float]:
        from .evaluate import evaluate

        result = evaluate(model, loader, device, amp, dist_info)
        return {"loss": result["loss"], "top1": result["top1"], "top5": result["top5"],
                "images": result["num_samples"]}
