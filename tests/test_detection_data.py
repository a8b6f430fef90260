"""COCO-layout data: targets, validation at open, negatives, large-scale jitter."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from weightformer.data import DataError
from weightformer.detection import CocoDetection, DroppedBoxesWarning, LargeScaleJitter, collate, drop_crowd

SIZES = {1: (64, 48), 2: (40, 56), 3: (64, 64)}  # image id -> (width, height)


def square_mask(width: int, height: int, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    mask[y0:y1, x0:x1] = 1
    return mask


def write_coco(root: Path, split: str = "val", extra_annotations: tuple[dict, ...] = (),
               skip_files: tuple[str, ...] = ()) -> Path:
    """A COCO tree: image 1 with a polygon square (category 3) and an RLE square (category 7),
    image 2 without annotations, image 3 with an RLE square (category 3). Dark images, bright squares."""
    (root / "images" / split).mkdir(parents=True)
    (root / "annotations").mkdir()
    images, annotations = [], []
    rle = mask_utils.encode(np.asfortranarray(square_mask(64, 48, 30, 20, 50, 40)))
    rle["counts"] = rle["counts"].decode()
    rle3 = mask_utils.encode(np.asfortranarray(square_mask(64, 64, 8, 8, 40, 24)))
    rle3["counts"] = rle3["counts"].decode()
    annotations += [
        {"id": 10, "image_id": 1, "category_id": 3, "bbox": [4, 6, 12, 10], "area": 120.0, "iscrowd": 0,
         "segmentation": [[4, 6, 16, 6, 16, 16, 4, 16]]},
        {"id": 11, "image_id": 1, "category_id": 7, "bbox": [30, 20, 20, 20], "area": 400.0, "iscrowd": 0,
         "segmentation": rle},
        {"id": 12, "image_id": 3, "category_id": 3, "bbox": [8, 8, 32, 16], "area": 512.0, "iscrowd": 0,
         "segmentation": rle3},
    ]
    annotations += list(extra_annotations)
    for image_id, (w, h) in SIZES.items():
        name = f"{image_id:06d}.png"
        images.append({"id": image_id, "file_name": name, "width": w, "height": h})
        if name in skip_files:
            continue
        pixels = np.full((h, w, 3), 20, np.uint8)
        for ann in annotations:
            if ann["image_id"] == image_id and ann["bbox"][2] > 0 and ann["bbox"][3] > 0:
                x, y, bw, bh = (int(v) for v in ann["bbox"])
                pixels[y:y + bh, x:x + bw] = 230
        Image.fromarray(pixels).save(root / "images" / split / name)
    categories = [{"id": 3, "name": "square"}, {"id": 7, "name": "block"}]
    path = root / "annotations" / f"instances_{split}.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def test_targets_follow_the_annotations(tmp_path):
    write_coco(tmp_path)
    ds = CocoDetection(tmp_path, "val")
    assert len(ds) == 3 and ds.num_classes == 3 and ds.class_names == ["__background__", "square", "block"]
    image, target = ds[0]
    assert image.shape == (3, 48, 64) and image.dtype == torch.float32 and 0 <= image.min() and image.max() <= 1
    assert torch.equal(target["boxes"], torch.tensor([[4.0, 6, 16, 16], [30, 20, 50, 40]]))
    assert target["labels"].tolist() == [1, 2] and [ds.label_to_category(i) for i in (1, 2)] == [3, 7]
    assert target["masks"].shape == (2, 48, 64) and target["masks"].dtype == torch.uint8
    # the RLE square decodes exactly; the polygon covers its box
    assert torch.equal(target["masks"][1], torch.from_numpy(square_mask(64, 48, 30, 20, 50, 40)))
    ys, xs = torch.where(target["masks"][0] > 0)
    assert 4 <= xs.min() and xs.max() <= 16 and 6 <= ys.min() and ys.max() <= 16
    assert int(target["image_id"]) == 1 and target["area"].tolist() == [120.0, 400.0]


def test_image_without_annotations_is_a_negative(tmp_path):
    write_coco(tmp_path)
    image, target = CocoDetection(tmp_path, "val")[1]
    assert image.shape == (3, 56, 40)
    assert target["boxes"].shape == (0, 4) and target["labels"].shape == (0,) and target["masks"].shape == (0, 56, 40)
    images, targets = collate([CocoDetection(tmp_path, "val")[i] for i in range(3)])
    assert [im.shape[-2:] for im in images] == [(48, 64), (56, 40), (64, 64)] and len(targets) == 3


def test_missing_images_stop_the_open_with_one_line(tmp_path):
    write_coco(tmp_path, skip_files=("000002.png", "000003.png"))
    with pytest.raises(DataError) as info:
        CocoDetection(tmp_path, "val")
    message = str(info.value)
    assert "\n" not in message and "2 image(s)" in message and "000002.png, 000003.png" in message


def test_unknown_category_names_the_id_and_annotation(tmp_path):
    bad = {"id": 99, "image_id": 3, "category_id": 5, "bbox": [1, 1, 4, 4], "area": 16.0, "iscrowd": 0,
           "segmentation": [[1, 1, 5, 1, 5, 5, 1, 5]]}
    write_coco(tmp_path, extra_annotations=(bad,))
    with pytest.raises(DataError, match=r"annotation 99 of 000003.png has category_id 5"):
        CocoDetection(tmp_path, "val")


def test_unreadable_or_absent_annotation_file(tmp_path):
    with pytest.raises(DataError, match="no image folder"):
        CocoDetection(tmp_path, "val")
    write_coco(tmp_path)
    (tmp_path / "annotations" / "instances_val.json").write_text("{not json")
    with pytest.raises(DataError, match="cannot read .* as JSON"):
        CocoDetection(tmp_path, "val")


def test_zero_width_boxes_are_dropped_with_one_warning(tmp_path):
    flat = [{"id": 20 + i, "image_id": 3, "category_id": 7, "bbox": [10, 10, w, h], "area": 0.0, "iscrowd": 0,
             "segmentation": [[10, 10, 11, 10, 11, 11]]} for i, (w, h) in enumerate([(0, 5), (5, -1), (1e-9, 3)])]
    write_coco(tmp_path, extra_annotations=tuple(flat))
    with pytest.warns(DroppedBoxesWarning, match="dropped 3 annotation"):
        ds = CocoDetection(tmp_path, "val")
    assert ds[2][1]["boxes"].shape == (1, 4)


def test_drop_crowd_removes_crowd_instances(tmp_path):
    write_coco(tmp_path)
    _, target = CocoDetection(tmp_path, "val")[0]
    target["iscrowd"] = torch.tensor([0, 1])
    kept = drop_crowd(target)
    assert kept["labels"].tolist() == [1] and kept["masks"].shape == (1, 48, 64) and kept["image_id"] == 1


def test_large_scale_jitter_gives_square_crops_with_consistent_instances(tmp_path):
    write_coco(tmp_path)
    ds = CocoDetection(tmp_path, "val", transforms=LargeScaleJitter(size=96))
    random.seed(0)
    kept = 0
    for _ in range(12):
        image, target = ds[0]
        assert image.shape == (3, 96, 96) and target["masks"].shape[1:] == (96, 96)
        boxes = target["boxes"]
        assert boxes.shape[0] == target["labels"].shape[0] == target["masks"].shape[0]
        assert (boxes[:, 2:] > boxes[:, :2]).all() and boxes.min() >= 0 and boxes.max() <= 96
        for box, mask in zip(boxes, target["masks"]):
            ys, xs = torch.where(mask > 0)
            if len(xs):  # the mask lies inside its box, to within a resampled pixel
                assert xs.min() >= box[0] - 1 and xs.max() <= box[2] and ys.min() >= box[1] - 1 and ys.max() <= box[3]
                kept += 1
    assert kept > 0
    image, target = ds[1]  # a negative stays one
    assert image.shape == (3, 96, 96) and target["boxes"].shape == (0, 4) and target["masks"].shape == (0, 96, 96)
