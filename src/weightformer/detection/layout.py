"""Where a COCO-layout split lies: images in ``images/<split>/`` (or ``<split>/``), instances in
``annotations/instances_<split>.json``; :func:`find_split` picks a split by its role when none is named."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

from ..data.errors import DataError
from . import synthetic

__all__ = ["SPLIT_NAMES", "CocoSplit", "data_root", "find_split", "locate_split", "split_files"]

# The split names tried, in order, for each role when the user names none: COCO 2017's, then the plain ones.
SPLIT_NAMES = {"train": ("train2017", "train"), "val": ("val2017", "val")}


class CocoSplit(NamedTuple):
    name: str
    image_dir: Path
    annotation_file: Path


def locate_split(root: Path, split: str) -> CocoSplit:
    """Where split ``split`` of ``root`` lies, whether or not it is there: the first of ``images/<split>/`` and
    ``<split>/`` that is a folder (else the first), and its annotation file."""
    folders = (root / "images" / split, root / split)
    return CocoSplit(split, next((d for d in folders if d.is_dir()), folders[0]),
                     root / "annotations" / f"instances_{split}.json")


def split_files(root: str | Path, split: str) -> Optional[CocoSplit]:
    """Split ``split`` under ``root``, or None if its image folder or its annotation file is missing."""
    found = locate_split(Path(root).expanduser(), split)
    return found if found.image_dir.is_dir() and found.annotation_file.is_file() else None


def looked_for(split: str) -> str:
    return f"images/{split}/ or {split}/ with annotations/instances_{split}.json"


def find_split(root: str | Path, role: str, split: Optional[str] = None, flag: Optional[str] = None) -> CocoSplit:
    """The split for ``role`` ("train" or "val"): ``split`` if given (and there), else the first of
    :data:`SPLIT_NAMES` that ``root`` holds; else one DataError line listing what was looked for and naming
    ``flag``, the option that names a split (default ``--train-split`` / ``--val-split``)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DataError(f"data folder {root} does not exist; pass --data with a COCO-layout folder, or shapes "
                        "(the offline set)")
    names = (split,) if split else SPLIT_NAMES[role]
    for name in names:
        found = split_files(root, name)
        if found is not None:
            return found
    what, flag = "training" if role == "train" else "validation", flag or f"--{role}-split"
    hint = (f"pass {flag} NAME for a split of another name" if not split
            else f"check the name, or drop {flag} to find {' or '.join(SPLIT_NAMES[role])}")
    raise DataError(f"{root} holds no COCO {what} split: looked for {'; '.join(looked_for(n) for n in names)}; {hint}")


def data_root(data: str) -> Path:
    """The COCO-layout folder ``--data`` names: the offline ``shapes`` set (drawn on first use), or a path."""
    return synthetic.shapes_root() if data == synthetic.SHAPES_NAME else Path(data).expanduser()
