"""An image's prediction does not depend on its batch or on how the batch is padded.

A WeightFormer's dynamic weights pool its whole input, so any padding changes every output. So no path pads an
image by what else is in its batch: classification's eval transform gives every image one size (the padding to
whole patches, ``dynamic_img_pad``, then depends on that size alone); segmentation predicts each image of a
batch alone at its own size (whole) or on windows of exactly the crop (slide), and trains on crops padded to
the crop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform
from torch.utils.data import DataLoader

import weightformer  # noqa: F401  (registers the models)
from weightformer.classification.evaluate import eval_transform_config, evaluate as evaluate_classifier
from weightformer.classification.predict import predict
from weightformer.engine.weights import LoadedModel
from weightformer.segmentation import SegmentationFolder, TrainTransform, build_upernet, collate_segmentation
from weightformer.segmentation.evaluation import eval_transform, evaluate as evaluate_segmenter
from weightformer.segmentation.inference import infer_each, whole_inference
from weightformer.segmentation.synthetic import write_shapes

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = torch.device("cpu")
SIZES = [(40, 25), (64, 64), (31, 90), (20, 20)]  # (width, height): wide, square, tall, smaller than the crop
ATOL = 1e-5


@pytest.fixture(scope="module")
def image_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(0)
    paths = []
    for i, (width, height) in enumerate(SIZES):
        paths.append(folder / f"{i}.png")
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(paths[-1])
    return paths


# -- classification ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def classifier() -> LoadedModel:
    """A 30 px model with 4 px patches and dynamic_img_pad: each image is padded to 32 px, by its own size."""
    torch.manual_seed(0)
    kwargs = {"patch_size": 4, "embed_dim": 32, "depth": 2, "img_size": 30, "dynamic_img_pad": True}
    model = timm.create_model("weightformer_tiny", num_classes=5, **kwargs).eval()
    meta = {"task": "classification", "model": "weightformer_tiny", "model_kwargs": kwargs, "num_classes": 5,
            "in_chans": 3, "img_size": 30, "mean": [0.5] * 3, "std": [0.25] * 3, "interpolation": "bilinear",
            "crop_pct": 0.875, "crop_mode": "center"}
    return LoadedModel(task=None, model=model, meta=meta, source="test")


def test_classification_eval_logits_of_an_image_alone_equal_it_in_a_batch(classifier: LoadedModel,
                                                                          image_files: list[Path]):
    transform = create_transform(**eval_transform_config(classifier.model, classifier.meta, None), is_training=False)
    images = [transform(Image.open(path).convert("RGB")) for path in image_files]
    assert {tuple(image.shape) for image in images} == {(3, 30, 30)}  # one size whatever the file's
    labels = torch.arange(len(images)) % 5
    with torch.no_grad():
        together = classifier.model(torch.stack(images))  # (4, 5)
        for i, image in enumerate(images):
            torch.testing.assert_close(classifier.model(image[None])[0], together[i], atol=ATOL, rtol=0)
    one, four = (evaluate_classifier(classifier.model, DataLoader(list(zip(images, labels)), batch_size=b), CPU)
                 for b in (1, 4))
    assert one["top1"] == four["top1"] and one["loss"] == pytest.approx(four["loss"], abs=ATOL)


def test_classification_predict_at_batch_1_equals_batch_4(classifier: LoadedModel, image_files: list[Path]):
    one, four = (predict(classifier, image_files, top_k=5, batch_size=b) for b in (1, 4))
    for (path_1, top_1), (path_4, top_4) in zip(one.rows, four.rows):
        assert path_1 == path_4 and [c for c, _, _ in top_1] == [c for c, _, _ in top_4]
        assert np.allclose([p for _, _, p in top_1], [p for _, _, p in top_4], atol=ATOL, rtol=0)


# -- segmentation -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def segmenter() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_upernet("weightformer_tiny", 4, embed_dim=32, depth=2, channels=16, pyramid_channels=16,
                         aux_channels=8).eval()


@pytest.mark.parametrize("mode", ["whole", "slide"])
def test_segmentation_logits_of_an_image_alone_equal_it_in_a_batch_of_other_sizes(segmenter, mode: str):
    torch.manual_seed(1)
    images = [torch.randn(3, height, width) for width, height in SIZES]
    batch = collate_segmentation([(image, torch.zeros(image.shape[-2:], dtype=torch.int64)) for image in images])
    with torch.no_grad():
        together = list(infer_each(segmenter, batch.images, batch.image_sizes.tolist(), mode, crop=48, stride=32))
        for image, logits in zip(images, together):
            alone = next(infer_each(segmenter, image[None], [image.shape[-2:]], mode, crop=48, stride=32))
            assert logits.shape == alone.shape == (1, 4, *image.shape[-2:])
            torch.testing.assert_close(logits, alone, atol=ATOL, rtol=0)
        # what per-image prediction avoids: the batch's padding changes the first image's logits
        height, width = images[0].shape[-2:]
        padded = whole_inference(segmenter, batch.images)[:1, :, :height, :width]
        assert (padded - together[0]).abs().max() > 1e-3


def test_segmentation_training_crops_share_one_canvas(image_files: list[Path]):
    """Crops are padded to the crop size (image 0, label 255), so the batch adds no padding of its own."""
    transform = TrainTransform(crop_size=48, scale=(192, 48))
    samples = []
    for path in image_files:
        pixels = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
        samples.append(transform(pixels, torch.zeros(pixels.shape[-2:], dtype=torch.int64), torch.Generator()))
    batch = collate_segmentation(samples)
    assert batch.images.shape == (4, 3, 48, 48) and batch.image_sizes.tolist() == [[48, 48]] * 4
    for (image, _), padded in zip(samples, batch.images):
        assert torch.equal(image, padded)


@pytest.mark.parametrize("mode", ["whole", "slide"])
def test_segmentation_miou_at_batch_1_equals_batch_8_on_mixed_sizes(segmenter, tmp_path: Path, mode: str):
    data = write_shapes(tmp_path / "shapes", train=1, val=10)  # 64-96 px scenes of different sizes and shapes
    val = SegmentationFolder(data, "validation", num_classes=4, transform=eval_transform(48))
    assert len({tuple(image.shape) for image, _ in val}) > 1
    one, eight = (evaluate_segmenter(segmenter, DataLoader(val, batch_size=b, collate_fn=collate_segmentation), 4,
                                     CPU, mode, crop=48, stride=32) for b in (1, 8))
    assert one["mIoU"] == eight["mIoU"] and one["aAcc"] == eight["aAcc"]
    np.testing.assert_array_equal(one["per_class_iou"], eight["per_class_iou"])
