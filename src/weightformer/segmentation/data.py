"""Semantic segmentation data in the ADE20K layout, with mmseg's label reduction and augmentation:

    <root>/images/{training,validation}/<name>.jpg      (also .jpeg, .png)
    <root>/annotations/{training,validation}/<name>.png  (class index per pixel, palette or grayscale PNG)

With ``reduce_zero_label`` (ADE20K) value 0 is unlabelled (ignore index 255) and v >= 1 is class v - 1."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import Tensor
from torch.utils.data import Dataset

from ..data.errors import DataError
from ..data.folder import DECODE_ERRORS
from ..data.images import read_image
from ..data.transforms import sample_seed
from .config import IGNORE_INDEX
from .synthetic import SHAPES_CLASSES, SHAPES_NAME, shapes_root

__all__ = ["ADE_CLASSES", "ADE_FOLDER", "IGNORE_INDEX", "SPLITS", "EvalTransform", "FolderClasses", "SegmentationBatch",
           "SegmentationFolder", "TrainTransform", "check_labelled", "class_names", "collate_segmentation",
           "find_root", "folder_classes", "read_label", "reduce_zero_label", "scan_pairs"]

SPLITS = ("training", "validation")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
LABEL_MODES = frozenset({"P", "L", "I;16", "I;16L", "I;16B", "I"})  # modes whose pixels are class indices
LAYOUT = "images/{training,validation}/*.jpg and annotations/{training,validation}/*.png"
SHOWN = 5  # bad values named in an error line
ADE_FOLDER = "ADEChallengeData2016"  # ADE20K's scene-parsing release: its zip's one folder
ADE_CLASS_FILE = "objectInfo150.txt"  # in it: Idx, Ratio, Train, Val, Name per class, tab-separated
ADE_CLASSES = 150  # classes of a folder too large to count them in
SCAN_LIMIT = 5000  # annotations read for the class count at most
LABEL_SAMPLE = 16  # annotations read when a split opens, to find a labelled pixel (check_labelled)
LABEL_CHUNK = 64  # annotations read at a time when the sample held none


def _reader_pool() -> ThreadPoolExecutor:  # for reading many small files' headers or pixels
    return ThreadPoolExecutor(max_workers=min(32, 4 * (os.cpu_count() or 1)))


def find_root(data: str | os.PathLike, splits: Sequence[str] = SPLITS) -> Path:
    """The folder with ``images/<split>`` and ``annotations/<split>``: the shapes set's, ``data``, or its ADE_FOLDER."""
    if str(data) == SHAPES_NAME:
        return shapes_root()
    path = Path(data).expanduser()
    for root in (path, path / ADE_FOLDER):
        if all((root / kind / split).is_dir() for kind in ("images", "annotations") for split in splits):
            return root
    names = splits[0] if len(splits) == 1 else "{" + ",".join(splits) + "}"
    state = "does not exist" if not path.exists() else "is not a folder" if not path.is_dir() else \
        "holds no segmentation data in a layout this package reads"
    raise DataError(f"segmentation data {path} {state}: looked for {path}/images/{names}/ with "
                    f"{path}/annotations/{names}/ (the ADE20K layout, as ADEChallengeData2016 is downloaded), "
                    f"and for the same in {path / ADE_FOLDER}/; pass such a folder, or shapes")


class FolderClasses(NamedTuple):
    count: int  # the data set's classes
    source: str  # where the count comes from: "objectInfo150.txt", "the largest label in 300 annotations", ...


def ade_class_names(root: Path) -> Optional[list[str]]:
    """The first name of each class row of ADE20K's ``objectInfo150.txt`` in ``root``, or None."""
    try:
        lines = (root / ADE_CLASS_FILE).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:  # not there (any other data set), or unreadable: count the annotations instead
        return None
    rows = [line.split("\t") for line in lines]
    names = [re.split(r"[;,]", row[-1])[0].strip() for row in rows if len(row) >= 2 and row[0].strip().isdigit()]
    return names or None


def class_names(data: str, root: Path, reduce_zero: bool) -> Optional[list[str]]:
    """The shapes set's class names, or ADE20K's (value 0, "other", first without ``reduce_zero``), or None."""
    if data == SHAPES_NAME:
        return list(SHAPES_CLASSES)
    names = ade_class_names(root)
    return names if names is None or reduce_zero else ["other", *names]


def _largest_label(path: str) -> int:
    raw = _label_pixels(path)
    values = raw[raw != IGNORE_INDEX]
    return int(values.max()) if values.size else -1


def folder_classes(data: str, root: Path, reduce_zero: bool) -> FolderClasses:
    """The class count when ``--num-classes`` is not given: that of :func:`class_names`, else the largest label
    of up to :data:`SCAN_LIMIT` annotations of both splits, else ADE20K's 150, saying so."""
    names = class_names(data, root, reduce_zero)
    if names is not None:
        return FolderClasses(len(names), "the shapes set's" if data == SHAPES_NAME else ADE_CLASS_FILE)
    files = [label for split in SPLITS for _, label in scan_pairs(root, split)]  # unpaired files: scan_pairs's errors
    if len(files) > SCAN_LIMIT:
        return FolderClasses(ADE_CLASSES, f"ADE20K's: {len(files)} annotations are too many to count the classes "
                                          f"in; pass --num-classes if that is not the count")
    with _reader_pool() as pool:
        largest = max(pool.map(_largest_label, files), default=-1)
    count = largest if reduce_zero else largest + 1
    if count < 1:
        zero = " (value 0 is unlabelled with reduce-zero-label: pass --no-reduce-zero-label if it is a class)" \
            if reduce_zero and largest == 0 else ""
        raise DataError(f"the annotations under {root / 'annotations'} hold no class labels{zero}; "
                        f"check the annotation files")
    return FolderClasses(count, f"the largest label in its {len(files)} annotations")


def _files(folder: Path, extensions: tuple[str, ...]) -> dict[str, Path]:
    if not folder.is_dir():
        raise DataError(f"{folder} is not a folder; segmentation data needs the ADE20K layout {LAYOUT}")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() not in extensions or path.name.startswith("."):
            continue
        if path.stem in found:
            raise DataError(f"{found[path.stem]} and {path} have the same name; keep one of them")
        found[path.stem] = path
    return found


def _others(names: list[str]) -> str:
    return f" ({len(names)} files lack theirs)" if len(names) > 1 else ""


def scan_pairs(root: str | os.PathLike, split: str) -> list[tuple[str, str]]:
    """``[(image path, annotation path)]`` of one split, sorted by name; every image needs its annotation."""
    if split not in SPLITS:
        raise DataError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"segmentation data folder {root} is not a folder; pass one with {LAYOUT}")
    image_dir, label_dir = root / "images" / split, root / "annotations" / split
    images, labels = _files(image_dir, IMAGE_EXTENSIONS), _files(label_dir, (".png",))
    no_label, no_image = sorted(images.keys() - labels.keys()), sorted(labels.keys() - images.keys())
    if no_label:
        raise DataError(f"image {images[no_label[0]]} has no annotation {label_dir / no_label[0]}.png"
                        f"{_others(no_label)}; add the annotation or remove the image")
    if no_image:
        raise DataError(f"annotation {labels[no_image[0]]} has no image {image_dir / no_image[0]}.jpg (or .jpeg, .png)"
                        f"{_others(no_image)}; add the image or remove the annotation")
    if not images:
        raise DataError(f"{image_dir} holds no images; segmentation data needs {LAYOUT}")
    return [(str(images[name]), str(labels[name])) for name in sorted(images)]


def _header_sizes(pair: tuple[str, str]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(image, annotation) (width, height) from the file headers."""
    sizes = []
    for path in pair:
        try:
            with Image.open(path) as img:
                sizes.append(img.size)
        except DECODE_ERRORS as exc:
            raise DataError(f"cannot read {path} ({type(exc).__name__}: {exc}); replace or remove it") from None
    return sizes[0], sizes[1]


def _size_mismatch(image_path: str, label_path: str, image_size: Sequence[int], label_size: Sequence[int]) -> DataError:
    (iw, ih), (lw, lh) = image_size, label_size
    return DataError(f"annotation {label_path} is {lw}x{lh} but its image {image_path} is {iw}x{ih} (width x "
                     f"height); an annotation must have its image's size: fix or remove the pair")


def reduce_zero_label(label: np.ndarray) -> np.ndarray:
    """mmseg's reduce_zero_label: 0 -> 255 (ignored), v -> v - 1, 255 stays 255."""
    label = label.astype(np.int64)
    return np.where((label == 0) | (label == IGNORE_INDEX), IGNORE_INDEX, label - 1)


def _label_pixels(path: str) -> np.ndarray:
    """An annotation's (H, W) values as stored (a palette PNG's indices, not its colours)."""
    try:
        with Image.open(path) as img:
            if img.mode not in LABEL_MODES:
                raise DataError(f"annotation {path} is a {img.mode} image; annotations must hold one class index per "
                                f"pixel (a palette (P) or grayscale (L) PNG), not colours: convert it")
            return np.asarray(img)
    except DECODE_ERRORS as exc:
        raise DataError(f"cannot read annotation {path} ({type(exc).__name__}: {exc}); replace or remove it") from None


def read_label(path: str, num_classes: int, reduce_zero: bool) -> np.ndarray:
    """An annotation as (H, W) int64 class indices in [0, num_classes) or 255."""
    raw = _label_pixels(path)
    label = reduce_zero_label(raw) if reduce_zero else raw.astype(np.int64)
    outside = (label != IGNORE_INDEX) & ((label < 0) | (label >= num_classes))
    if outside.any():
        bad = np.unique(raw[outside])
        shown = ", ".join(str(v) for v in bad[:SHOWN]) + (", ..." if len(bad) > SHOWN else "")
        needed = int(label[outside].max()) + 1
        if needed > IGNORE_INDEX:
            rule = f"class indices must stay below {IGNORE_INDEX}, the ignore index"
            fix = "remap the annotations to fewer class indices"
        elif reduce_zero:
            rule = f"with reduce-zero-label, value v is class v-1, at most {num_classes}; 0 and 255 are ignored"
            fix = f"pass --num-classes {needed} if the data set has that many classes"
        else:
            rule = f"without reduce-zero-label, values must be below {num_classes}; 255 is ignored"
            either = " or turn reduce-zero-label on if 0 marks unlabelled pixels" if needed == num_classes + 1 else ""
            fix = f"pass --num-classes {needed}{either}"
        raise DataError(f"annotation {path} holds values {shown} outside the {num_classes} classes ({rule}); {fix}")
    return label


def _labelled(path: str, reduce_zero: bool) -> tuple[bool, bool]:
    """Whether annotation ``path`` holds a pixel that is not ignored, and whether it holds a 0."""
    raw = _label_pixels(path)
    zero = raw == 0
    ignored = (raw == IGNORE_INDEX) | zero if reduce_zero else raw == IGNORE_INDEX
    return not bool(ignored.all()), bool(zero.any())


def check_labelled(pairs: Sequence[tuple[str, str]], split: str, reduce_zero: bool) -> None:
    """DataError if no annotation of one split's ``pairs`` holds a pixel that is not ignored. Reads
    :data:`LABEL_SAMPLE` annotations spread over the split first, the others only if none of them holds one."""
    labels = [label for _, label in pairs]
    if not labels:
        return
    sample = sorted({round(i * (len(labels) - 1) / max(1, LABEL_SAMPLE - 1)) for i in range(LABEL_SAMPLE)})
    chosen = set(sample)
    rest = [label for i, label in enumerate(labels) if i not in chosen]
    batches = [[labels[i] for i in sample]] + [rest[i:i + LABEL_CHUNK] for i in range(0, len(rest), LABEL_CHUNK)]
    zeros = False
    with _reader_pool() as pool:
        for batch in batches:
            for labelled, zero in pool.map(lambda path: _labelled(path, reduce_zero), batch):
                if labelled:
                    return
                zeros = zeros or zero
    folder = Path(labels[0]).parent
    if reduce_zero and zeros:
        every = "0 or 255, both ignored with reduce-zero-label (0 means unlabelled)"
        fix = "pass --no-reduce-zero-label if 0 is a class of this data set, or check how the annotations were made"
    else:
        every = f"{IGNORE_INDEX}, the ignore index"
        fix = "the annotations must hold class indices: check how they were made"
    outcome = "training would learn nothing at a loss of 0" if split == "training" else "there is nothing to score"
    raise DataError(f"none of the {len(labels)} annotations in {folder} holds a labelled pixel: every pixel is "
                    f"{every}, so {outcome}; {fix}")


def _uniform(low: float, high: float, generator: Optional[torch.Generator]) -> float:
    return low + (high - low) * torch.rand((), generator=generator).item()


def _chance(p: float, generator: Optional[torch.Generator]) -> bool:
    return torch.rand((), generator=generator).item() < p


def _fit_size(height: int, width: int, scale: tuple[int, int]) -> tuple[int, int]:
    """(height, width) rescaled, ratio kept, as large as fits: long side <= max(scale), short side <= min(scale)."""
    factor = min(max(scale) / max(height, width), min(scale) / min(height, width))
    return int(height * factor + 0.5), int(width * factor + 0.5)


def _resize_image(image: Tensor, size: tuple[int, int]) -> Tensor:  # (3, H, W) float -> (3, h, w) float
    return F.interpolate(image[None], size=size, mode="bilinear", align_corners=False)[0]


def _normalise(image: Tensor, mean: Tensor, std: Tensor) -> Tensor:  # (3, H, W) in [0, 255] -> normalised
    return (image - mean[:, None, None]) / std[:, None, None]


def _photometric_distortion(image: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """mmseg's PhotoMetricDistortion on a (3, H, W) image in [0, 255], each step with chance 1/2: brightness
    +-32, contrast x[0.5, 1.5] (before or after the colour steps), saturation x[0.5, 1.5], hue +-18 of 180."""
    if _chance(0.5, generator):
        image = (image + _uniform(-32, 32, generator)).clamp(0, 255)
    contrast_first = _chance(0.5, generator)
    steps = [lambda x: (x * _uniform(0.5, 1.5, generator)).clamp(0, 255),
             lambda x: TF.adjust_saturation(x / 255, _uniform(0.5, 1.5, generator)) * 255,
             lambda x: TF.adjust_hue(x / 255, _uniform(-0.1, 0.1, generator)) * 255]
    for step in steps if contrast_first else steps[1:] + steps[:1]:
        if _chance(0.5, generator):
            image = step(image)
    return image


class TrainTransform:
    """mmseg's ADE20K training pipeline on (3, H, W) uint8 image and (H, W) label: resize to fit ``scale`` times
    a ratio from ``ratio_range``; a ``crop_size`` crop, redrawn up to 10 times while one class covers more
    than ``cat_max_ratio`` of it; flip; photometric distortion; pad to ``crop_size`` (image 0, label 255)."""

    def __init__(self, crop_size: int = 512, scale: tuple[int, int] = (2048, 512),
                 ratio_range: tuple[float, float] = (0.5, 2.0), cat_max_ratio: float = 0.75, hflip: float = 0.5,
                 photometric: bool = True, mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
                 std: Sequence[float] = IMAGENET_DEFAULT_STD):
        self.crop_size, self.scale, self.ratio_range = crop_size, scale, ratio_range
        self.cat_max_ratio, self.hflip, self.photometric = cat_max_ratio, hflip, photometric
        self.mean, self.std = 255 * torch.tensor(mean), 255 * torch.tensor(std)

    def _crop_box(self, label: Tensor, generator: Optional[torch.Generator]) -> tuple[int, int, int, int]:
        height, width = label.shape
        crop_h, crop_w = min(self.crop_size, height), min(self.crop_size, width)
        for _ in range(10):
            top = int(torch.randint(height - crop_h + 1, (), generator=generator))
            left = int(torch.randint(width - crop_w + 1, (), generator=generator))
            if self.cat_max_ratio >= 1:
                break
            counts = torch.bincount(label[top : top + crop_h, left : left + crop_w].flatten(), minlength=256)
            counts = counts[:IGNORE_INDEX][counts[:IGNORE_INDEX] > 0]
            if len(counts) > 1 and counts.max() < self.cat_max_ratio * counts.sum():
                break
        return top, left, crop_h, crop_w

    def __call__(self, image: Tensor, label: Tensor, generator: Optional[torch.Generator] = None
                 ) -> tuple[Tensor, Tensor]:
        ratio = _uniform(*self.ratio_range, generator)
        size = _fit_size(*label.shape, (int(self.scale[0] * ratio), int(self.scale[1] * ratio)))
        image = _resize_image(image.float(), size)  # (3, h, w)
        label = F.interpolate(label[None, None].float(), size=size, mode="nearest")[0, 0].long()  # (h, w)
        top, left, crop_h, crop_w = self._crop_box(label, generator)
        image = image[:, top : top + crop_h, left : left + crop_w]
        label = label[top : top + crop_h, left : left + crop_w]
        if _chance(self.hflip, generator):
            image, label = image.flip(-1), label.flip(-1)
        if self.photometric:
            image = _photometric_distortion(image, generator)
        image = _normalise(image, self.mean, self.std)
        pad = (0, self.crop_size - crop_w, 0, self.crop_size - crop_h)
        return F.pad(image, pad), F.pad(label, pad, value=IGNORE_INDEX)


class EvalTransform:
    """The image rescaled (ratio kept) to fit ``scale`` and normalised; the label keeps its size, as mmseg's."""

    def __init__(self, scale: tuple[int, int] = (2048, 512), mean: Sequence[float] = IMAGENET_DEFAULT_MEAN,
                 std: Sequence[float] = IMAGENET_DEFAULT_STD):
        self.scale, self.mean, self.std = scale, 255 * torch.tensor(mean), 255 * torch.tensor(std)

    def __call__(self, image: Tensor, label: Tensor, generator: Optional[torch.Generator] = None
                 ) -> tuple[Tensor, Tensor]:
        image = _resize_image(image.float(), _fit_size(*image.shape[-2:], self.scale))
        return _normalise(image, self.mean, self.std), label


class SegmentationFolder(Dataset):
    """(image (3, H, W) uint8, label (H, W) int64) pairs of one split, through ``transform(image, label,
    generator)``, whose generator is seeded from (seed, epoch, index) when ``seed`` is given."""

    def __init__(self, root: str | os.PathLike, split: str = "training", reduce_zero_label: bool = True,
                 num_classes: int = 150, transform: Optional[Callable[..., tuple[Tensor, Tensor]]] = None,
                 seed: Optional[int] = None, verify: bool = True):
        if not 0 < num_classes <= IGNORE_INDEX:
            raise DataError(f"--num-classes {num_classes} must be in [1, {IGNORE_INDEX}]: label {IGNORE_INDEX} "
                            f"is ignored")
        self.pairs = scan_pairs(root, split)
        check_labelled(self.pairs, split, reduce_zero_label)  # milliseconds: a sample of the annotations
        self.reduce_zero_label, self.num_classes, self.transform = reduce_zero_label, num_classes, transform
        self.seed, self.epoch = seed, 0
        if verify:
            with _reader_pool() as pool:
                for pair, (image_size, label_size) in zip(self.pairs, pool.map(_header_sizes, self.pairs)):
                    if image_size != label_size:
                        raise _size_mismatch(*pair, image_size, label_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        image_path, label_path = self.pairs[index]
        image = read_image(image_path)
        label = read_label(label_path, self.num_classes, self.reduce_zero_label)
        if image.size != (label.shape[1], label.shape[0]):
            raise _size_mismatch(image_path, label_path, image.size, (label.shape[1], label.shape[0]))
        image_t, label_t = TF.pil_to_tensor(image), torch.from_numpy(label)  # (3, H, W) uint8, (H, W) int64
        if self.transform is None:
            return image_t, label_t
        seed = None if self.seed is None else sample_seed(self.seed, self.epoch, index)
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return self.transform(image_t, label_t, generator)


class SegmentationBatch(NamedTuple):
    images: Tensor  # (B, 3, H, W), zero-padded
    labels: Tensor  # (B, H_l, W_l), padded with the ignore index
    image_sizes: Tensor  # (B, 2) int64
    label_sizes: Tensor  # (B, 2) int64


def collate_segmentation(samples: Sequence[tuple[Tensor, Tensor]]) -> SegmentationBatch:
    """Stack (image, label) samples of different sizes, padding at the bottom and right."""
    image_sizes = torch.tensor([image.shape[-2:] for image, _ in samples], dtype=torch.int64)
    label_sizes = torch.tensor([label.shape[-2:] for _, label in samples], dtype=torch.int64)
    (image_h, image_w), (label_h, label_w) = image_sizes.amax(0).tolist(), label_sizes.amax(0).tolist()
    images = torch.stack([F.pad(im, (0, image_w - im.shape[-1], 0, image_h - im.shape[-2])) for im, _ in samples])
    labels = torch.stack([F.pad(lb, (0, label_w - lb.shape[-1], 0, label_h - lb.shape[-2]), value=IGNORE_INDEX)
                          for _, lb in samples])
    return SegmentationBatch(images, labels, image_sizes, label_sizes)
