"""Classification's settings: the engine's, plus timm's augmentation and evaluation preprocessing. The defaults
are neutral (flips and timm's random resized crops); the recipes (``configs/classification/``) set the rest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from ..engine.config import setting
from ..engine.errors import ConfigError
from ..long_range import LongRangeConfig

__all__ = ["ClassificationConfig"]


@dataclass
class ClassificationConfig(LongRangeConfig):
    """A classification run: any timm model on an ImageFolder tree or a built-in data set."""

    data: str = setting("mnist", help="an ImageFolder tree with train/ and val/ (class folders in each), webdataset "
                                      "tar shards in train/ and val/, a Hugging Face data set (save_to_disk, or "
                                      "parquet/arrow files), or a built-in data set: mnist, or a long-range probe "
                                      "(docs/probes.md: glyph_match, glyph_xor, count_compare, path_link, "
                                      "mirror_match, scale_match, glyph_count; options after a colon)")
    train_split: str = setting("train", help="the training split: a folder of --data, a brace pattern of its tar "
                                             "shards such as 'train/shard-{000000..000099}.tar', or a Hugging Face "
                                             "split")
    val_split: str = setting("val", help="the validation split, as --train-split (Hugging Face: val or validation)")
    image_column: str = setting("image", help="a Hugging Face data set's image column")
    label_column: str = setting("label", help="a Hugging Face data set's label column (class indices)")
    model: str = setting("weightformer_tiny", help="any timm model name")
    smoothing: float = 0.0  # label smoothing
    mixup: float = 0.0  # Beta alpha; 0 turns mixup off
    cutmix: float = 0.0  # Beta alpha; 0 turns cutmix off
    auto_augment: Optional[str] = None  # a timm RandAugment/AugMix/AutoAugment string
    reprob: float = 0.0  # random erasing probability
    color_jitter: float = 0.0  # timm applies it only without auto_augment (or with a "3a" policy)
    train_scale: tuple[float, float] = (0.08, 1.0)  # RandomResizedCrop area range
    interpolation: str = "bicubic"
    crop_pct: float = 0.875  # eval: resize to img_size / crop_pct, centre-crop img_size
    crop_mode: Optional[str] = None  # eval resize: center, squash or border; None: the model's pretrained config

    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("smoothing", lambda v: 0 <= v < 1, "in [0, 1): 0 for none, 0.1 for the paper's"),
        ("mixup", lambda v: v >= 0, "0 (off) or a positive Beta alpha such as 0.8"),
        ("cutmix", lambda v: v >= 0, "0 (off) or a positive Beta alpha such as 1.0"),
        ("reprob", lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
        ("color_jitter", lambda v: v >= 0, "0 (off) or more, such as 0.4"),
        ("train_scale", lambda v: 0 < v[0] <= v[1] <= 1, "[min, max] image-area fractions with 0 < min <= max <= 1"),
        ("crop_pct", lambda v: 0 < v <= 1, "in (0, 1], such as 0.875"),
        ("crop_mode", lambda v: v in (None, "center", "squash", "border"), "center, squash, border, or null (the model's)"),
    )

    def split_names(self) -> dict[str, str]:
        """The data's splits by role: the folders, shard patterns or Hugging Face splits."""
        return {"train": self.train_split, "val": self.val_split}

    def check(self) -> None:
        from timm.data.transforms import _str_to_torch_interpolation  # timm: here, the command line reads this class

        super().check()
        interpolations = tuple(_str_to_torch_interpolation)  # what timm's train and eval transforms both accept
        if self.interpolation not in interpolations:
            raise ConfigError(f"interpolation must be one of {', '.join(interpolations)}, got {self.interpolation!r}")
        check_auto_augment(self.auto_augment)


def check_auto_augment(policy: Optional[str]) -> None:
    """``policy`` must parse with timm's RandAugment/AugMix/AutoAugment parsers (as create_transform calls them)."""
    if not policy:
        return
    from timm.data import create_transform

    try:
        create_transform(32, is_training=True, auto_augment=policy)
    except (AssertionError, ValueError) as exc:  # how timm's parsers reject a policy string
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "timm cannot parse it"
        raise ConfigError(f"auto_augment {policy!r} is not a timm augmentation policy ({reason}); use a RandAugment "
                          f"string such as rand-m9-mstd0.5-inc1, an AugMix string such as augmix-m5-w4-d2, an "
                          f"AutoAugment policy (original, originalr, v0, v0r, 3a), or null for none") from exc
