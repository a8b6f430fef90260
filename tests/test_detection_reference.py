"""Detection against its references: one fixed canvas for every image (detectron2's ViTDet pads to 1024² in
training and test), so an image's detections do not depend on its batch; the points of detectron2's protocol
(boxes from the cropped masks, PIL's bilinear resizing, images without objects left out of training, weight
decay groups, head init); and ``det eval``'s category names and ``--split``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from weightformer.checkpoint import CheckpointError
from weightformer.cli import main
from weightformer.detection import DetectionConfig, DetectionTask, LargeScaleJitter, build_detector, synthetic
from weightformer.detection.evaluation import evaluate_checkpoint
from weightformer.detection.recipes import COCO, recipe
from weightformer.engine import CHECKPOINT_FORMAT
from weightformer.engine.distributed import init_distributed
from weightformer.engine.config import validate_config
from weightformer.engine.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

SIDE = 96
# (height, width): wide, tall and square images, all resized to long side 96 and padded to 96²
SIZES = [(96, 64), (64, 96), (96, 96), (48, 96), (96, 48), (80, 96), (96, 72), (64, 64)]
CATEGORIES = [{"id": 1, "name": "box"}, {"id": 2, "name": "bar"}]
DETECTOR = {"conv_dim": 16, "fc_dim": 32, "rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 16,
            "box_detections_per_img": 10}
META = {"task": "detection", "model": "weightformer_tiny", "model_kwargs": {"embed_dim": 32, "depth": 2},
        "detector_kwargs": DETECTOR, "num_classes": 2, "classes": ["box", "bar"], "cascade": False,
        "protocol": "vitdet", "img_size": SIDE, "max_size": SIDE, "canvas": SIDE}


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    images = []
    for h, w in SIZES:
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        pixels[h // 4:h // 2, w // 4:3 * w // 4] = 230  # a bright bar
        images.append(pixels)
    return images


def _to_tensor(pixels: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(pixels).permute(2, 0, 1).float() / 255  # as CocoDetection reads the PNG


def _write_coco(root: Path, annotations: list[dict], categories: list[dict] = CATEGORIES) -> Path:
    (root / "images" / "val").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    entries = []
    for i, pixels in enumerate(_images(), 1):
        Image.fromarray(pixels).save(root / "images" / "val" / f"{i}.png")
        entries.append({"id": i, "file_name": f"{i}.png", "height": pixels.shape[0], "width": pixels.shape[1]})
    (root / "annotations" / "instances_val.json").write_text(json.dumps(
        {"images": entries, "annotations": annotations, "categories": categories}))
    return root


@pytest.fixture(scope="module")
def detector() -> nn.Module:
    """A random vitdet Mask R-CNN on a WeightFormer, with its class scores spread out so they rank clearly."""
    torch.manual_seed(0)
    model = build_detector(META).eval()
    with torch.no_grad():
        model.roi_heads.box_predictor.cls_score.weight.mul_(300)
    return model


@pytest.fixture(scope="module")
def scored(detector: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a checkpoint of ``detector``, COCO data whose ground truth is its top 3 detections of each image alone)."""
    root = tmp_path_factory.mktemp("mixed")
    checkpoint = root / "random.pt"
    torch.save({"model": detector.state_dict(), "meta": {**META, "data": str(root / "coco")},
                "format": CHECKPOINT_FORMAT}, checkpoint)
    annotations = []
    with torch.no_grad():
        for i, pixels in enumerate(_images(), 1):
            found = detector([_to_tensor(pixels)])[0]
            for (x1, y1, x2, y2), label in zip(found["boxes"][:3].tolist(), found["labels"][:3].tolist()):
                annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": int(label),
                                    "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0,
                                    "segmentation": [[x1, y1, x2, y1, x2, y2, x1, y2]]})
    return checkpoint, _write_coco(root / "coco", annotations)


def test_an_image_alone_gives_the_detections_it_gives_inside_a_batch(detector: nn.Module):
    """detectron2 pads every image to the same 1024² in training and test (ViTDet); here to one canvas too, so
    the dynamic weights, which pool the whole input, see the same input whatever the rest of the batch."""
    images = [_to_tensor(p) for p in _images()]
    with torch.no_grad():
        batched = detector(images)
        for image, together in zip(images, batched):
            alone = detector([image])[0]
            assert len(alone["boxes"]) > 0
            for key in ("boxes", "scores", "labels"):
                torch.testing.assert_close(alone[key], together[key], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(alone["masks"], together["masks"], rtol=1e-5, atol=1e-5)
        padded, _ = detector.transform(images)
    assert padded.tensors.shape == (len(SIZES), 3, SIDE, SIDE)


def test_det_eval_at_batch_1_and_8_gives_the_same_map(scored: tuple[Path, Path]):
    checkpoint, _ = scored
    one, eight = (evaluate_checkpoint(checkpoint, batch_size=b, workers=0, device="cpu") for b in (1, 8))
    assert one["bbox_mAP"] > 30 and one["images"] == len(SIZES)
    assert one == eight


def test_the_canvas_is_a_setting_recorded_in_the_checkpoint_and_old_ones_get_the_smallest(tmp_path: Path):
    task = DetectionTask(DetectionConfig(data="shapes", img_size=100))
    assert task.canvas == 128  # the LSJ crop, rounded up to the pyramid's stride 32
    cfg = DetectionConfig(data="shapes", det_resize="shortest_edge", img_size=800, det_max_size=1333, det_canvas=1344)
    assert DetectionTask(cfg).canvas == 1344
    with pytest.raises(ConfigError, match="det_canvas 1024 is smaller"):
        DetectionTask(DetectionConfig(data="shapes", det_resize="shortest_edge", det_canvas=1024))
    with pytest.raises(ConfigError, match="multiple of 32"):
        validate_config(DetectionConfig(data="shapes", det_canvas=100))
    old = {k: v for k, v in META.items() if k != "canvas"}
    assert DetectionTask.upgrade_checkpoint({"meta": {**old, "max_size": 1333}}, 1)["meta"]["canvas"] == 1344
    assert recipe(COCO).values["det_canvas"] == 1024  # ViTDet's 1024²


# detectron2's protocol ------------------------------------------------------------------------------------
def test_lsj_boxes_are_the_boxes_of_the_cropped_masks():
    """detectron2 (ViTDet's LSJ, ``recompute_boxes``) takes the boxes of the cropped masks; clamping the
    original box to the crop would keep the triangle's full width where only its tip is left."""
    image = torch.rand(3, 100, 100)
    masks = torch.tril(torch.ones(100, 100, dtype=torch.uint8))[None]  # the lower-left triangle, y >= x
    target = {"boxes": torch.tensor([[0.0, 0.0, 100.0, 100.0]]), "labels": torch.tensor([1]), "masks": masks,
              "area": torch.tensor([5050.0]), "iscrowd": torch.tensor([0])}
    for seed in range(8):
        torch.manual_seed(seed)
        import random
        random.seed(seed)
        _, out = LargeScaleJitter(64, (1.5, 1.5), flip=0.0)(image, target)
        for box, mask in zip(out["boxes"], out["masks"]):
            ys, xs = torch.where(mask.bool())
            assert box.tolist() == [xs.min().item(), ys.min().item(), xs.max().item() + 1, ys.max().item() + 1]


def test_resizing_is_pils_bilinear():
    """detectron2 resizes with PIL's bilinear (antialiased when shrinking), for LSJ and for the test-time resize."""
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)
    pil = np.asarray(Image.fromarray(pixels).resize((64, 48), Image.BILINEAR)).astype(np.float32) / 255
    jittered, _ = LargeScaleJitter(64, (1.0, 1.0), flip=0.0)(_to_tensor(pixels), {
        "boxes": torch.zeros((0, 4)), "labels": torch.zeros(0, dtype=torch.int64),
        "masks": torch.zeros((0, 120, 160), dtype=torch.uint8), "area": torch.zeros(0),
        "iscrowd": torch.zeros(0, dtype=torch.int64)})
    assert np.abs(jittered[:, :48].permute(1, 2, 0).numpy() - pil).max() < 1.5 / 255
    model = build_detector({**META, "img_size": 64, "max_size": 64, "canvas": 64}).eval()
    resized, _ = model.transform.resize(_to_tensor(pixels))
    assert np.abs(resized.permute(1, 2, 0).numpy() - pil).max() < 1.5 / 255


def test_training_leaves_out_images_without_objects_and_evaluation_keeps_them(tmp_path: Path):
    """detectron2's ``filter_empty_annotations`` (train loader only)."""
    root = synthetic.write_shapes(tmp_path / "data", seed=3, split_sizes={"train": 9, "val": 12})
    annotated = {split: len({a["image_id"] for a in json.loads(
        (root / "annotations" / f"instances_{split}.json").read_text())["annotations"]}) for split in ("train", "val")}
    assert annotated == {"train": 8, "val": 9}  # and 1 and 3 negatives
    data = DetectionTask(DetectionConfig(data=str(root), img_size=64)).build_data(init_distributed("cpu"))
    assert (len(data.train_set), len(data.val_set)) == (8, 12)
    assert "8 train (train, 1 without objects left out)" in data.description


def _group_of(groups: list[dict], model: nn.Module) -> dict[str, dict]:
    by_id = {id(p): g for g in groups for p in g["params"]}
    return {name: by_id[id(p)] for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("layer_decay", [None, 0.5])
def test_weight_decay_groups_are_detectron2s_under_vitdet(layer_decay):
    """ViTDet: ``get_default_optimizer_params(weight_decay_norm=0)`` and ``pos_embed`` at 0: biases decay, only
    norm layers (and position embeddings) do not; layer decay's ``lr_scale`` stays. torchvision: timm's groups."""
    settings = dict(data="shapes", model="deit_tiny_patch16_224", model_kwargs={"depth": 2}, weight_decay=0.1,
                    layer_decay=layer_decay)
    task = DetectionTask(DetectionConfig(**settings))
    model = build_detector({**META, "model": "deit_tiny_patch16_224", "model_kwargs": {"depth": 2}})
    groups = _group_of(task.param_groups(model), model)
    assert groups["roi_heads.box_head.5.bias"]["weight_decay"] == 0.1  # an fc's bias
    assert groups["backbone.backbone.blocks.0.attn.qkv.bias"]["weight_decay"] == 0.1
    assert groups["backbone.backbone.blocks.0.norm1.weight"]["weight_decay"] == 0.0
    assert groups["roi_heads.box_head.0.1.weight"]["weight_decay"] == 0.0  # a LayerNorm2d
    assert groups["backbone.backbone.pos_embed"]["weight_decay"] == 0.0
    if layer_decay:
        assert groups["backbone.backbone.blocks.0.attn.qkv.bias"]["lr_scale"] == 0.5 ** 2
    timm_groups = DetectionTask(DetectionConfig(**settings, det_protocol="torchvision")).param_groups(model)
    if timm_groups is not None:
        assert _group_of(timm_groups, model)["roi_heads.box_head.5.bias"]["weight_decay"] == 0.0


def test_heads_start_at_detectron2s_init_under_vitdet():
    """detectron2: FastRCNNConvFCHead's fcs c2_xavier_fill (kaiming_uniform a=1, bias 0), FastRCNNOutputLayers
    N(0, 0.01) scores and N(0, 0.001) deltas, MaskRCNNConvUpsampleHead's predictor N(0, 0.001), all biases 0."""
    torch.manual_seed(0)
    heads = build_detector({**META, "detector_kwargs": {"conv_dim": 64, "fc_dim": 256}}).roi_heads
    fc = heads.box_head[5]
    bound = math.sqrt(3 / fc.in_features)  # kaiming_uniform(a=1): U(-bound, bound)
    assert fc.weight.abs().max() <= bound and abs(fc.weight.std().item() - bound / math.sqrt(3)) < 0.05 * bound
    for layer, std in ((heads.box_predictor.cls_score, 0.01), (heads.box_predictor.bbox_pred, 0.001),
                       (heads.mask_predictor.mask_fcn_logits, 0.001)):
        assert abs(layer.weight.std().item() - std) < 0.1 * std and not layer.bias.any()
    assert not fc.bias.any() and not heads.mask_predictor.conv5_mask.bias.any()
    torchvision = build_detector({**META, "protocol": "torchvision"}).roi_heads
    assert torchvision.mask_predictor.mask_fcn_logits.weight.std() > 0.01  # torchvision's kaiming normal


# det eval's data against the checkpoint -------------------------------------------------------------------
def _relabelled(scored: tuple[Path, Path], root: Path, categories: list[dict]) -> Path:
    """The scored data with ``categories`` in place of its own (ids 1, 2 kept on the annotations)."""
    coco = json.loads((scored[1] / "annotations" / "instances_val.json").read_text())
    return _write_coco(root, coco["annotations"], categories)


def test_det_eval_matches_categories_by_name(scored: tuple[Path, Path], tmp_path: Path):
    """The same names under other ids score as the data the checkpoint was trained on (classification
    refuses what it cannot match, too)."""
    checkpoint, data = scored
    coco = json.loads((data / "annotations" / "instances_val.json").read_text())
    swapped = {1: 2, 2: 1}
    for ann in coco["annotations"]:
        ann["category_id"] = swapped[ann["category_id"]]
    permuted = _write_coco(tmp_path / "permuted", coco["annotations"],
                           [{"id": 1, "name": "bar"}, {"id": 2, "name": "box"}])
    same = evaluate_checkpoint(checkpoint, workers=0, device="cpu")
    moved = evaluate_checkpoint(checkpoint, data=str(permuted), workers=0, device="cpu")
    assert same["bbox_mAP"] > 30 and {k: v for k, v in moved.items() if k != "data"} == \
        {k: v for k, v in same.items() if k != "data"}


def test_det_eval_refuses_other_category_names_in_one_line(scored: tuple[Path, Path], tmp_path: Path, capsys):
    other = _relabelled(scored, tmp_path / "pets", [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}])
    with pytest.raises(CheckpointError, match="names categories cat, dog that .* was not trained on"):
        evaluate_checkpoint(scored[0], data=str(other), workers=0, device="cpu")
    code = main(["det", "eval", "--checkpoint", str(scored[0]), "--data", str(other), "--device", "cpu",
                 "--workers", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "box, bar" in err[0]


def test_det_eval_bad_split_names_its_own_flag(scored: tuple[Path, Path], capsys):
    code = main(["det", "eval", "--checkpoint", str(scored[0]), "--split", "bad", "--device", "cpu", "--workers", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "drop --split" in err[0] and "--val-split" not in err[0]
