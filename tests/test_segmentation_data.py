"""Segmentation data: ADE20K layout, reduce-zero-label, label checks as one-line DataErrors, joint transforms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from weightformer.data import DataError
from weightformer.segmentation import (
    EvalTransform,
    SegmentationFolder,
    TrainTransform,
    collate_segmentation,
    find_root,
    reduce_zero_label,
)


def write_pair(root: Path, split: str, name: str, label: np.ndarray, image_size=None, mode: str = "L",
               pixels=None) -> None:
    """images/<split>/<name>.jpg (random, the label's size unless ``image_size``; or ``pixels`` as a lossless
    .png) and its annotation PNG."""
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations" / split).mkdir(parents=True, exist_ok=True)
    if pixels is None:
        width, height = image_size or (label.shape[1], label.shape[0])
        random = np.random.default_rng(len(name)).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        Image.fromarray(random).save(root / "images" / split / f"{name}.jpg")
    else:
        Image.fromarray(pixels).save(root / "images" / split / f"{name}.png")
    annotation = Image.fromarray(label.astype(np.uint8), mode="L")
    if mode == "P":
        annotation = annotation.convert("P")
        annotation.putpalette([255 - i % 256 for i in range(768)])  # colours unlike the indices
    elif mode == "RGB":
        annotation = annotation.convert("RGB")
    annotation.save(root / "annotations" / split / f"{name}.png")


def ade_label(height: int = 12, width: int = 16) -> np.ndarray:
    label = np.zeros((height, width), dtype=np.uint8)  # 0: unlabelled
    label[:, 4:8], label[:, 8:12], label[:, 12:] = 1, 2, 150
    label[0, 0] = 255
    return label


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_pairs_reduce_zero_label_and_no_reduction(tmp_path: Path):
    write_pair(tmp_path, "training", "b", ade_label())
    write_pair(tmp_path, "training", "a", ade_label(8, 6))
    data = SegmentationFolder(tmp_path, "training")
    assert [Path(p).name for p, _ in data.pairs] == ["a.jpg", "b.jpg"]
    image, label = data[1]
    assert image.shape == (3, 12, 16) and image.dtype == torch.uint8 and label.dtype == torch.int64
    assert label[0, 0] == 255 and label[1, 0] == 255  # 255 stays ignored, 0 becomes ignored
    assert (label[1, 4], label[1, 8], label[1, 12]) == (0, 1, 149)  # v -> v - 1
    raw = SegmentationFolder(tmp_path, "training", reduce_zero_label=False, num_classes=151)[1][1]
    assert (raw[1, 0], raw[1, 4], raw[1, 12], raw[0, 0]) == (0, 1, 150, 255)
    np.testing.assert_array_equal(reduce_zero_label(np.array([0, 1, 2, 150, 254, 255])), [255, 0, 1, 149, 253, 255])


def test_palette_annotations_read_as_indices(tmp_path: Path):
    write_pair(tmp_path, "validation", "p", ade_label(), mode="P")
    _, label = SegmentationFolder(tmp_path, "validation")[0]
    assert (label[1, 4], label[1, 8], label[1, 12]) == (0, 1, 149)


@pytest.mark.parametrize("missing", ["annotation", "image"])
def test_unpaired_files_are_named(tmp_path: Path, missing: str):
    write_pair(tmp_path, "training", "a", ade_label())
    write_pair(tmp_path, "training", "b", ade_label())
    gone = tmp_path / ("annotations/training/b.png" if missing == "annotation" else "images/training/b.jpg")
    gone.unlink()
    with pytest.raises(DataError) as excinfo:
        SegmentationFolder(tmp_path, "training")
    message = one_line_error(excinfo)
    kept = "images/training/b.jpg" if missing == "annotation" else "annotations/training/b.png"
    assert f"{tmp_path / kept} has no {missing} {gone}" in message


def test_missing_layout_is_explained(tmp_path: Path):
    with pytest.raises(DataError, match=r"images/training is not a folder; .*ADE20K layout"):
        SegmentationFolder(tmp_path, "training")


def test_the_layouts_users_have(tmp_path: Path):
    """ADE20K as downloaded (--data at ADEChallengeData2016, or at the folder its zip was unpacked in), and
    any folder in its layout; anything else is one line saying what was looked for."""
    ade = tmp_path / "downloads" / "ADEChallengeData2016"
    for split in ("training", "validation"):
        write_pair(ade, split, f"ADE_{split[:5]}_00000001", ade_label())
    assert find_root(ade) == ade and find_root(tmp_path / "downloads") == ade
    assert len(SegmentationFolder(find_root(tmp_path / "downloads"), "validation")) == 1
    only_val = tmp_path / "val_only"
    write_pair(only_val, "validation", "a", ade_label())
    assert find_root(only_val, ("validation",)) == only_val  # what seg eval needs
    for data, state in ((only_val, "holds no segmentation data in a layout this package reads"),
                        (tmp_path / "nowhere", "does not exist"),
                        (ade / "images" / "training" / "ADE_train_00000001.jpg", "is not a folder")):
        with pytest.raises(DataError) as excinfo:
            find_root(data)
        message = one_line_error(excinfo)
        assert f"segmentation data {data} {state}: looked for {data}/images/{{training,validation}}/ with " \
               f"{data}/annotations/{{training,validation}}/" in message
        assert f"and for the same in {data / 'ADEChallengeData2016'}/; pass such a folder, or shapes" in message


def test_size_mismatch_is_caught_at_open_and_when_loading(tmp_path: Path):
    write_pair(tmp_path, "training", "a", ade_label(12, 16), image_size=(20, 12))
    with pytest.raises(DataError) as excinfo:
        SegmentationFolder(tmp_path, "training")
    assert "annotations/training/a.png is 16x12 but its image" in one_line_error(excinfo)
    assert "is 20x12 (width x height)" in str(excinfo.value)
    unverified = SegmentationFolder(tmp_path, "training", verify=False)
    with pytest.raises(DataError, match="is 16x12 but its image"):
        unverified[0]


def test_values_outside_the_classes_name_the_file_values_and_fix(tmp_path: Path):
    label = ade_label()
    label[2, 2], label[3, 3] = 200, 160
    write_pair(tmp_path, "training", "a", label)
    data = SegmentationFolder(tmp_path, "training")  # values are checked as labels are read
    with pytest.raises(DataError) as excinfo:
        data[0]
    message = one_line_error(excinfo)
    assert "a.png holds values 160, 200 outside the 150 classes" in message and "--num-classes 200" in message
    assert SegmentationFolder(tmp_path, "training", num_classes=200)[0][1].max() == 255

    write_pair(tmp_path, "validation", "b", ade_label())  # values 0..150: 151 values without the reduction
    with pytest.raises(DataError, match="values 150 outside .* or turn reduce-zero-label on"):
        SegmentationFolder(tmp_path, "validation", reduce_zero_label=False)[0]


def test_colour_annotations_are_refused(tmp_path: Path):
    write_pair(tmp_path, "training", "a", ade_label(), mode="RGB")
    with pytest.raises(DataError, match="is a RGB image; annotations must hold one class index per pixel"):
        SegmentationFolder(tmp_path, "training")[0]


def test_a_bad_label_in_a_worker_arrives_as_its_one_line(tmp_path: Path):
    label = ade_label()
    label[5, 5] = 151
    write_pair(tmp_path, "training", "a", label)
    loader = DataLoader(SegmentationFolder(tmp_path, "training"), batch_size=1, num_workers=1,
                        collate_fn=collate_segmentation)
    with pytest.raises(DataError) as excinfo:
        next(iter(loader))
    assert one_line_error(excinfo).startswith(f"annotation {tmp_path / 'annotations/training/a.png'} holds values 151")


def label_as_image_data(tmp_path: Path, seed=None, transform=None) -> SegmentationFolder:
    """A data set whose decoded image (after normalising with mean 0, std 1/255) can be compared to its label."""
    label = np.random.default_rng(0).integers(1, 4, size=(40, 60)).astype(np.uint8)
    write_pair(tmp_path, "training", "a", label, pixels=np.stack([label - 1] * 3, axis=-1))  # pixel = class index
    return SegmentationFolder(tmp_path, "training", num_classes=3, transform=transform, seed=seed)


def test_train_transform_moves_image_and_label_together_and_pads(tmp_path: Path):
    same_scale = TrainTransform(crop_size=32, scale=(60, 40), ratio_range=(1.0, 1.0), cat_max_ratio=1.0,
                                photometric=False, mean=(0, 0, 0), std=(1 / 255,) * 3)
    data = label_as_image_data(tmp_path, seed=0, transform=same_scale)
    for epoch in range(4):  # different crops and flips; the image's pixels must still equal the label
        data.set_epoch(epoch)
        image, label = data[0]
        assert image.shape == (3, 32, 32) and label.shape == (32, 32)
        torch.testing.assert_close(image[0], label.float())
    big = TrainTransform(crop_size=64, scale=(60, 40), ratio_range=(1.0, 1.0), photometric=False)
    image, label = label_as_image_data(tmp_path, seed=0, transform=big)[0]
    assert image.shape == (3, 64, 64) and (label[40:] == 255).all() and (label[:, 60:] == 255).all()
    assert (image[:, 40:] == 0).all() and (label[:40, :60] != 255).all()


def test_train_transform_is_reproducible_per_seed_epoch_and_index(tmp_path: Path):
    data = label_as_image_data(tmp_path, seed=3, transform=TrainTransform(crop_size=24, scale=(120, 80)))
    first, again = data[0], data[0]
    torch.testing.assert_close(first, again)
    data.set_epoch(1)
    assert not torch.equal(first[0], data[0][0])
    assert data[0][0].shape == (3, 24, 24)


def test_cat_max_ratio_redraws_crops_dominated_by_one_class():
    label = torch.zeros(32, 32, dtype=torch.long)
    label[:, 16:] = 1  # 7 of the 17 crop columns hold both classes, neither above 75%
    image = torch.zeros(3, 32, 32, dtype=torch.uint8)

    def mixed_crops(cat_max_ratio: float) -> int:
        transform = TrainTransform(crop_size=16, scale=(32, 32), ratio_range=(1.0, 1.0), cat_max_ratio=cat_max_ratio,
                                   photometric=False)
        crops = [transform(image, label, torch.Generator().manual_seed(seed))[1] for seed in range(20)]
        return sum(torch.bincount(crop.flatten(), minlength=2).max().item() < 0.75 * crop.numel() for crop in crops)

    mixed, drawn_once = mixed_crops(0.75), mixed_crops(1.0)
    assert mixed >= 18 and drawn_once <= 12, (mixed, drawn_once)  # each crop mixed: 99.5% in 10 draws, 41% in one


def test_eval_transform_resizes_the_image_only_and_collate_pads():
    image, label = torch.zeros(3, 100, 300, dtype=torch.uint8), torch.ones(100, 300, dtype=torch.long)
    resized, kept = EvalTransform(scale=(200, 50))(image, label)
    assert resized.shape == (3, 50, 150) and kept is label  # ratio kept, shorter side 50; the label stays
    small = (torch.ones(3, 20, 30), torch.zeros(20, 25, dtype=torch.long))
    batch = collate_segmentation([(resized, kept), small])
    assert batch.images.shape == (2, 3, 50, 150) and batch.labels.shape == (2, 100, 300)
    assert batch.image_sizes.tolist() == [[50, 150], [20, 30]] and batch.label_sizes.tolist() == [[100, 300], [20, 25]]
    assert (batch.images[1, :, 20:] == 0).all() and (batch.labels[1, 20:] == 255).all()
    assert (batch.labels[1, :20, 25:] == 255).all() and (batch.labels[1, :20, :25] == 0).all()
