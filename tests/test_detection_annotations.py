"""COCO annotation files are checked when the data set opens: what detectron2 drops is dropped with a
warning that counts it, and everything else that would fail in the data loader (an epoch later, for
the val split), in COCOeval, or be read as something the file does not say, is one DataError line
naming the file, the annotation and the fix."""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils
from torch.utils.data import DataLoader

from weightformer.cli import main
from weightformer.data import DataError
from weightformer.detection import CocoDetection, collate, synthetic
from weightformer.detection.annotations import DroppedAnnotationsWarning
from weightformer.detection.evaluation import CocoEvaluator

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = {1: (64, 48), 2: (40, 56), 3: (64, 64)}  # image id -> (width, height)


def square_mask(width: int, height: int, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    mask = np.zeros((height, width), np.uint8)
    mask[y0:y1, x0:x1] = 1
    return mask


def rle(mask: np.ndarray) -> dict[str, Any]:
    encoded = mask_utils.encode(np.asfortranarray(mask))
    return {"size": list(encoded["size"]), "counts": encoded["counts"].decode()}


def base_content() -> dict[str, Any]:
    """Image 1: a polygon square (annotation 10, category 3) and an RLE square (11, category 7); image 2:
    none; image 3: a polygon (12)."""
    return {
        "images": [{"id": i, "file_name": f"{i:06d}.png", "width": w, "height": h} for i, (w, h) in SIZES.items()],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 3, "bbox": [4, 6, 12, 10], "area": 120.0, "iscrowd": 0,
             "segmentation": [[4, 6, 16, 6, 16, 16, 4, 16]]},
            {"id": 11, "image_id": 1, "category_id": 7, "bbox": [30, 20, 20, 20], "area": 400.0, "iscrowd": 0,
             "segmentation": rle(square_mask(64, 48, 30, 20, 50, 40))},
            {"id": 12, "image_id": 3, "category_id": 3, "bbox": [8, 8, 32, 16], "area": 512.0, "iscrowd": 0,
             "segmentation": [[8, 8, 40, 8, 40, 24, 8, 24]]},
        ],
        "categories": [{"id": 3, "name": "square"}, {"id": 7, "name": "block"}],
    }


def write_tree(root: Path, edit: Callable[[dict[str, Any]], None] = lambda content: None, split: str = "val") -> Path:
    """A COCO-layout split under ``root``: the images of :func:`base_content`, its annotations as ``edit``
    leaves them. Returns the annotation file."""
    (root / "images" / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    for image_id, (w, h) in SIZES.items():
        Image.fromarray(np.full((h, w, 3), 20, np.uint8)).save(root / "images" / split / f"{image_id:06d}.png")
    content = base_content()
    edit(content)
    path = root / "annotations" / f"instances_{split}.json"
    path.write_text(json.dumps(content))
    return path


def ann(content: dict[str, Any], ann_id: int) -> dict[str, Any]:
    return next(a for a in content["annotations"] if a["id"] == ann_id)


def extra(content: dict[str, Any], **fields: Any) -> None:
    """Add annotation 20 on image 3 (a valid polygon square), with ``fields`` over it."""
    content["annotations"].append({"id": 20, "image_id": 3, "category_id": 7, "bbox": [44, 40, 10, 10],
                                   "area": 100.0, "iscrowd": 0, "segmentation": [[44, 40, 54, 40, 54, 50, 44, 50]],
                                   **fields})


def setter(ann_id: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda content: ann(content, ann_id).update(fields)


def every_item(dataset: CocoDetection) -> list[dict[str, torch.Tensor]]:
    """Every target, through a DataLoader as training reads them."""
    return [t for _, targets in DataLoader(dataset, batch_size=2, collate_fn=collate) for t in targets]


# -------------------------------------------------------------------------------------------------
# One DataError line at open: the file, the annotation (or image), what is wrong, the fix
# -------------------------------------------------------------------------------------------------
def _drop_key(key: str, ann_id: int = 10) -> Callable[[dict[str, Any]], None]:
    return lambda content: ann(content, ann_id).pop(key)


def _image(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda content: content["images"][0].update(fields)


def _compressed_cut(content: dict[str, Any]) -> None:
    ann(content, 11)["segmentation"]["counts"] = ann(content, 11)["segmentation"]["counts"][:-1]


ERRORS = {
    # (edit, what the line says)
    "bbox of strings": (setter(10, bbox=["4", "6", "12", "10"]),
                        "annotation 10 of 000001.png has bbox ['4', '6', '12', '10']; a bbox is [x, y, width, height]"),
    "bbox of words": (setter(10, bbox=["left", 6, 12, 10]), "annotation 10 of 000001.png has bbox ['left', 6, 12, 10]"),
    "bbox of 3": (setter(12, bbox=[8, 8, 32]), "annotation 12 of 000003.png has bbox [8, 8, 32]"),
    "bbox NaN": (setter(12, bbox=[8, 8, float("nan"), 16]), "annotation 12 of 000003.png has bbox [8, 8, nan, 16]"),
    "no bbox": (_drop_key("bbox", 12), "annotation 12 of 000003.png has no bbox"),
    "no images": (lambda content: content.update(images=[]), "lists no images (images is empty)"),
    "images not a list": (lambda content: content.update(images={}), "images is a JSON dict, not a list"),
    "no categories": (lambda content: content.update(categories=[], annotations=[]), "declares no categories"),
    "garbage RLE string": (setter(11, segmentation={"size": [48, 64], "counts": "not an RLE!"}),
                           "annotation 11 of 000001.png has an RLE mask whose counts 'not an RLE!' are no run lengths"),
    "cut RLE string": (_compressed_cut, "annotation 11 of 000001.png has an RLE mask whose"),
    "RLE runs short": (setter(11, segmentation={"size": [48, 64], "counts": [5, 6, 7]}),
                       "annotation 11 of 000001.png has an RLE mask whose runs cover 18 pixels, not the 3072"),
    "RLE negative run": (setter(11, segmentation={"size": [48, 64], "counts": [-5, 3077]}),
                         "annotation 11 of 000001.png has an RLE mask whose counts [-5, 3077] are no run lengths"),
    "RLE without size": (setter(11, segmentation={"counts": [3072]}), "has an RLE mask whose size is None"),
    "RLE of another size": (setter(11, segmentation=rle(square_mask(32, 24, 2, 2, 20, 20))),
                            "annotation 11 of 000001.png has an RLE mask of 24x32 pixels (height x width) on a 48x64 "
                            "image (it would be stretched over the image); re-encode the mask at its image's size"),
    "flat polygon": (setter(10, segmentation=[4, 6, 16, 6, 16, 16, 4, 16]),
                     "annotation 10 of 000001.png has segmentation [4, 6, 16, 6, 16, 16, 4, 16], which is no list of "
                     "polygons [[x1, y1, x2, y2, ...], ...]; wrap the polygon in a list"),
    "segmentation string": (setter(10, segmentation="square"), "has segmentation 'square', which is neither polygons"),
    "no segmentation": (_drop_key("segmentation"), "annotation 10 of 000001.png has no segmentation"),
    "polygon of words": (setter(10, segmentation=[[4, 6, 16, "six", 16, 16, 4, 16]]),
                         "annotation 10 of 000001.png has a polygon coordinate 'six', not a finite number"),
    "polygon of null": (setter(12, segmentation=[[8, 8, 40, 8, None, 24, 8, 24]]), "polygon coordinate None"),
    "polygon of points": (setter(12, segmentation=[[[8, 8], [40, 8], [40, 24]]]), "polygon coordinate [8, 8]"),
    "polygon NaN": (setter(12, segmentation=[[8, 8, 40, 8, float("inf"), 24, 8, 24]]), "polygon coordinate inf"),
    "duplicate image ids": (lambda content: content["images"][1].update(id=3),
                            "image id 3 is listed twice (000002.png and 000003.png), so one image would be lost"),
    "duplicate annotation ids": (setter(12, id=10), "annotation id 10 is used twice"),
    "annotation without id": (_drop_key("id"), "annotations[0] has id None; give every annotation a unique integer id"),
    "string image id": (_image(id="1"), "images[0] ('000001.png') has id '1'; COCO image ids are integers"),
    "image without width": (lambda content: content["images"][0].pop("width"),
                            "image 1 (000001.png) has width None; it must be the image's width in pixels"),
    "image without file name": (lambda content: content["images"][2].pop("file_name"), "image 3 has file_name None"),
    "iscrowd 2": (setter(12, iscrowd=2), "annotation 12 of 000003.png has iscrowd 2; it must be 0"),
    "area of text": (setter(12, area="big"), "annotation 12 of 000003.png has area 'big'"),
    "unknown category": (setter(12, category_id=5), "annotation 12 of 000003.png has category_id 5, which the file "
                                                    "does not declare under categories"),
    "duplicate category ids": (lambda content: content["categories"].append({"id": 3, "name": "again"}),
                               "category id 3 is declared twice"),
    "not an annotation": (lambda content: content["annotations"].append("cat"), "annotations[3] is 'cat'"),
    "every image id wrong": (lambda content: [a.update(image_id=str(a["image_id"])) for a in content["annotations"]],
                             "none of its 3 annotations belongs to an image it lists (annotation 10 has image_id '1', "
                             "the images' ids run from 1 to 3)"),
    "boxes without masks": (lambda content: [a.update(segmentation=[]) for a in content["annotations"]],
                            "none of its 3 annotations has a usable mask (3 have an empty segmentation"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_a_bad_annotation_file_is_one_line_at_open_naming_the_file_and_annotation(case: str, tmp_path: Path):
    edit, expected = ERRORS[case]
    path = write_tree(tmp_path, edit)
    with pytest.raises(DataError) as info:
        CocoDetection(tmp_path, "val")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}") and expected in message, message


def test_a_bad_val_annotation_stops_det_train_before_the_first_step(tmp_path: Path, capsys):
    """A garbage RLE in the val split: one error line and exit 2 before training starts,
    not a traceback from the data loader after an epoch; the run leaves no folder behind."""
    root = synthetic.write_shapes(tmp_path / "coco", seed=1, split_sizes={"train": 2, "val": 2})
    path = root / "annotations" / "instances_val.json"
    content = json.loads(path.read_text())
    content["annotations"][0]["segmentation"] = {"size": [5, 5], "counts": "garbage"}
    path.write_text(json.dumps(content))
    run = tmp_path / "run"
    code = main(["det", "train", "--data", str(root), "--output", str(run), "--epochs", "1",
                 "--model-kwargs", "embed_dim=32", "depth=2", "--img-size", "64", "--batch-size", "2", "--workers", "0",
                 "--device", "cpu"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in captured.err
    assert f"{path}: annotation {content['annotations'][0]['id']} of " in errors[0] and "RLE mask" in errors[0]
    assert "train loss" not in captured.out and not run.exists()


# -------------------------------------------------------------------------------------------------
# Dropped, and counted in one warning line per reason (what detectron2 drops)
# -------------------------------------------------------------------------------------------------
def _open_warned(root: Path) -> tuple[CocoDetection, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = CocoDetection(root, "val")
    return dataset, [str(w.message) for w in caught if issubclass(w.category, DroppedAnnotationsWarning)]


def test_degenerate_polygons_are_dropped_and_counted_and_the_rest_of_the_mask_kept(tmp_path: Path):
    def edit(content: dict[str, Any]) -> None:
        # annotation 10: its square and an odd polygon (7 numbers), which pycocotools truncated into the mask
        ann(content, 10)["segmentation"].append([20, 2, 40, 2, 40, 30, 20])
        ann(content, 12)["segmentation"] = [[8, 8, 40, 8]]  # 2 points: pycocotools reads them as a box
        extra(content, segmentation=[])  # an empty segmentation list
    path = write_tree(tmp_path, edit)
    dataset, lines = _open_warned(tmp_path)
    assert lines == [f"{path}: dropped 2 polygon(s) of fewer than 3 points or with an odd number of coordinates, as "
                     "detectron2 does; 2 annotation(s) were left without a mask and dropped (annotation 12, 20)"]
    assert sorted(dataset.coco.anns) == [10, 11]  # evaluation sees what training sees
    targets = every_item(dataset)  # nothing fails in the loader
    square = mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects([[4, 6, 16, 6, 16, 16, 4, 16]], 48, 64)))
    assert torch.equal(targets[0]["masks"][0], torch.from_numpy(square))  # without the truncated odd polygon
    assert targets[2]["boxes"].shape == (0, 4) and targets[2]["masks"].shape == (0, 64, 64)


def test_annotations_of_unknown_images_are_dropped_and_counted(tmp_path: Path):
    def edit(content: dict[str, Any]) -> None:
        extra(content, id=21, image_id=99)
        extra(content, id=22, image_id="3")
    path = write_tree(tmp_path, edit)
    dataset, lines = _open_warned(tmp_path)
    assert lines == [f"{path}: dropped 2 annotation(s) whose image_id is not under images (annotation 21, 22); they "
                     "belong to no image of this split"]
    assert sorted(dataset.coco.anns) == [10, 11, 12] and len(dataset) == 3


def test_a_clean_file_warns_nothing_and_is_left_as_it_was(tmp_path: Path):
    write_tree(tmp_path)
    dataset, lines = _open_warned(tmp_path)
    assert lines == [] and dataset.coco.dataset["annotations"] == base_content()["annotations"]


def test_a_missing_area_is_the_masks_so_cocoeval_can_score(tmp_path: Path):
    """COCOeval reads every ground truth's area (its size buckets), which would be a KeyError after a whole
    evaluation: a missing one is the mask's area; the file's own areas are kept."""
    write_tree(tmp_path, lambda content: [a.pop("area") for a in content["annotations"] if a["id"] != 12])
    dataset = CocoDetection(tmp_path, "val")
    assert {i: a["area"] for i, a in dataset.coco.anns.items()} == {10: 120.0, 11: 400.0, 12: 512.0}
    evaluator = CocoEvaluator(dataset.coco, dataset.category_ids)
    masks = torch.from_numpy(square_mask(64, 48, 4, 6, 16, 16)).float()[None, None]
    evaluator.update([1], [{"boxes": torch.tensor([[4.0, 6, 16, 16]]), "scores": torch.tensor([0.9]),
                            "labels": torch.tensor([1]), "masks": masks}])
    metrics = evaluator.compute()
    assert 0 < metrics["bbox_mAP"] <= 100 and 0 < metrics["segm_mAP"] <= 100


def test_the_input_content_is_not_changed(tmp_path: Path):
    from weightformer.detection.annotations import check_instances

    content = base_content()
    ann(content, 10)["segmentation"].append([1, 2, 3, 4])
    ann(content, 12).pop("area")
    before = copy.deepcopy(content)
    checked, lines = check_instances(content, tmp_path / "instances_val.json")
    assert content == before and len(lines) == 1
    assert ann(checked, 10)["segmentation"] == [[4, 6, 16, 6, 16, 16, 4, 16]] and ann(checked, 12)["area"] == 512.0


def test_compressed_rles_of_any_mask_pass_and_decode(tmp_path: Path):
    """The check reads COCO's compressed RLE strings as pycocotools does: every encoding of a mask passes."""
    from weightformer.detection.annotations import _rle_problem

    rng = np.random.default_rng(0)
    for _ in range(200):
        height, width = (int(v) for v in rng.integers(1, 120, size=2))
        mask = (rng.random((height, width)) < rng.random()).astype(np.uint8)
        assert _rle_problem(rle(mask), height, width) is None
    write_tree(tmp_path)
    assert every_item(CocoDetection(tmp_path, "val"))[0]["masks"][1].sum() == 400
