"""A segmentation split whose annotations hold no labelled pixel (every pixel ignored) is one DataError
line when it opens, not a run at loss 0 without a word. The check reads a sample of the
annotations, and all of them only when the sample holds no labelled pixel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from weightformer.cli import main
from weightformer.data import DataError
from weightformer.segmentation import SegmentationFolder
from weightformer.segmentation import data as seg_data
from weightformer.segmentation.synthetic import write_shapes

TINY = ["--model-kwargs", "embed_dim=32", "depth=2", "channels=16", "pyramid_channels=16", "aux_channels=8",
        "--img-size", "32", "--batch-size", "4", "--epochs", "1", "--workers", "0", "--device", "cpu"]


def write_split(root: Path, split: str, labels: list[np.ndarray]) -> Path:
    """images/<split>/<i>.png and annotations/<split>/<i>.png, one pair per label."""
    for kind in ("images", "annotations"):
        (root / kind / split).mkdir(parents=True, exist_ok=True)
    for i, label in enumerate(labels):
        Image.fromarray(np.zeros((*label.shape, 3), np.uint8)).save(root / "images" / split / f"{i:03d}.png")
        Image.fromarray(label.astype(np.uint8)).save(root / "annotations" / split / f"{i:03d}.png")
    return root / "annotations" / split


def filled(value: int, count: int = 3) -> list[np.ndarray]:
    return [np.full((8, 8), value, np.uint8) for _ in range(count)]


def test_a_split_of_unlabelled_pixels_is_one_line_at_open(tmp_path: Path):
    folder = write_split(tmp_path, "training", [np.where(np.eye(8) > 0, 255, 0) for _ in range(3)])  # 0s and 255s
    with pytest.raises(DataError) as info:
        SegmentationFolder(tmp_path, "training")  # reduce-zero-label: ADE20K's 0 is unlabelled
    message = str(info.value)
    assert "\n" not in message
    assert message == (f"none of the 3 annotations in {folder} holds a labelled pixel: every pixel is 0 or 255, both "
                       "ignored with reduce-zero-label (0 means unlabelled), so training would learn nothing at a "
                       "loss of 0; pass --no-reduce-zero-label if 0 is a class of this data set, or check how the "
                       "annotations were made")
    assert len(SegmentationFolder(tmp_path, "training", reduce_zero_label=False, num_classes=1)) == 3  # 0 is a class


def test_an_all_ignore_index_split_is_refused_with_or_without_the_reduction(tmp_path: Path):
    folder = write_split(tmp_path, "validation", filled(255))
    for reduce_zero in (True, False):
        with pytest.raises(DataError) as info:
            SegmentationFolder(tmp_path, "validation", reduce_zero_label=reduce_zero)
        assert str(info.value) == (f"none of the 3 annotations in {folder} holds a labelled pixel: every pixel is 255, "
                                   "the ignore index, so there is nothing to score; the annotations must hold class "
                                   "indices: check how they were made")


def test_one_labelled_pixel_anywhere_is_enough(tmp_path: Path, monkeypatch):
    """Outside the sample too: the rest is read when the sample holds none."""
    monkeypatch.setattr(seg_data, "LABEL_SAMPLE", 2)
    monkeypatch.setattr(seg_data, "LABEL_CHUNK", 2)
    labels = filled(0, 7)
    labels[4][3, 3] = 5  # neither the first nor the last: not in the sample
    write_split(tmp_path, "training", labels)
    assert len(SegmentationFolder(tmp_path, "training")) == 7


def test_opening_a_labelled_split_reads_only_a_sample(tmp_path: Path, monkeypatch):
    write_split(tmp_path, "training", filled(3, 40))
    read = []
    original = seg_data._label_pixels
    monkeypatch.setattr(seg_data, "_label_pixels", lambda path: read.append(path) or original(path))
    SegmentationFolder(tmp_path, "training", verify=False)
    assert 1 <= len(read) <= seg_data.LABEL_SAMPLE


def test_seg_train_on_unlabelled_annotations_stops_before_training(tmp_path: Path, capsys):
    data = write_shapes(tmp_path / "shapes", train=4, val=2)
    for label in (data / "annotations" / "training").iterdir():
        width, height = Image.open(label).size
        Image.fromarray(np.zeros((height, width), np.uint8)).save(label)  # every pixel "unlabelled"
    run = tmp_path / "run"
    code = main(["seg", "train", "--data", str(data), "--num-classes", "4", "--output", str(run), *TINY])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.err.startswith("error: none of the 4 annotations in ")
    assert len(captured.err.strip().splitlines()) == 1
    assert "--no-reduce-zero-label" in captured.err and "train loss" not in captured.out and not run.exists()
