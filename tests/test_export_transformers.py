"""transformers loads a ``weightformer export --format hf`` folder through its timm wrapper, offline:
``AutoImageProcessor`` preprocesses as our evaluation does (checked against PIL and numpy written out
here), ``AutoModelForImageClassification`` gives our logits and our class names, ``AutoModel`` our
pooled features, and the pipeline runs. For a classifier trained by our engine on MNIST digits (exported
taking RGB: PIL's luma weights folded into its stem) and for models made with
``timm.create_model`` (a WeightFormer, another timm architecture, and one timm read from a Hub folder).
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch
from PIL import Image

transformers = pytest.importorskip("transformers")

import weightformer  # noqa: E402,F401  (registers the architectures that transformers builds with timm)
from conftest_train import single_thread, tiny_config  # noqa: E402
from timm.data import create_transform  # noqa: E402
from transformers import AutoImageProcessor, AutoModel, AutoModelForImageClassification  # noqa: E402

from weightformer.classification.evaluate import eval_transform_config  # noqa: E402
from weightformer.data import open_dataset  # noqa: E402
from weightformer.engine import load_model, train  # noqa: E402
from weightformer.export import to_hf  # noqa: E402
from weightformer.export.cli import main as export_main  # noqa: E402

# What the logits of transformers' model and ours may differ by (the same float32 arithmetic).
LOGIT_TOLERANCE = 1e-5
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
IMAGENET_MEAN, IMAGENET_STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])


@pytest.fixture(scope="module", autouse=True)
def offline():
    """No Hub and no network: HF_HUB_OFFLINE, and any socket connection fails the test."""
    import huggingface_hub.constants as hub_constants

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")

    with pytest.MonkeyPatch.context() as patch, single_thread():
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
        patch.setattr(socket.socket, "connect", refuse)
        yield


@pytest.fixture(scope="module")
def mnist_export(tmp_path_factory):
    """A tiny classifier trained by ``weightformer train``'s engine on the bundled digits (3 steps),
    exported by ``weightformer export --format hf``: (the checkpoint, the Hub folder)."""
    root = tmp_path_factory.mktemp("mnist")
    config = tiny_config("mnist", root / "run", img_size=28, epochs=1, max_steps=3, batch_size=8,
                         model_kwargs={"patch_size": 4, "embed_dim": 32, "depth": 2})
    best = train(config, task="classification").best_checkpoint
    folder = root / "wf-mnist"
    assert export_main(["--checkpoint", best, "--format", "hf", "--out", str(folder)]) == 0
    return best, folder


def digits() -> list[Image.Image]:
    """Two held-out MNIST digits ("L" images), stretched to 40×34 so that the resize has work to do."""
    _, splits = open_dataset("mnist", splits=("val",), warn=False)
    return [splits["val"][i][0].resize((40, 34), Image.NEAREST) for i in (0, 1)]


def photo(width: int, height: int) -> Image.Image:
    """A synthetic RGB image (two gradients and a disc), not square."""
    y, x = np.mgrid[0:height, 0:width]
    disc = ((x - width / 3) ** 2 + (y - height / 2) ** 2 < (height / 4) ** 2) * 120
    pixels = np.stack([x * 255 / width, y * 255 / height, np.clip(80 + disc, 0, 255)], axis=-1)
    return Image.fromarray(pixels.astype(np.uint8), "RGB")


def logits_of(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(pixels)


def test_a_trained_mnist_classifier_loads_with_its_preprocessing_labels_and_logits(mnist_export):
    """The 1-channel model is exported taking RGB (the pipeline's input): on grey images it is the model."""
    best, folder = mnist_export
    processor = AutoImageProcessor.from_pretrained(folder)
    model = AutoModelForImageClassification.from_pretrained(folder)
    assert type(processor).__name__ == "TimmWrapperImageProcessor"
    assert type(model).__name__ == "TimmWrapperForImageClassification"
    assert model.config.id2label == {i: str(i) for i in range(10)}  # the checkpoint's class folders
    assert f'AutoModelForImageClassification.from_pretrained("{folder.name}")' in (folder / "README.md").read_text()

    images = digits()
    pixels = processor([im.convert("RGB") for im in images])["pixel_values"]  # (2, 3, 28, 28)
    # the checkpoint's preprocessing: squash to 28×28 (crop_pct 1), bilinear, MNIST mean/std in each channel
    by_hand = np.stack([np.asarray(im.resize((28, 28), Image.BILINEAR), np.float32)[None] / 255 for im in images])
    grey = torch.from_numpy((by_hand - MNIST_MEAN) / MNIST_STD).float()  # (2, 1, 28, 28)
    torch.testing.assert_close(pixels, grey.expand(-1, 3, -1, -1), rtol=0, atol=1e-6)
    ours = load_model(best, task="classification")
    our_transform = create_transform(**eval_transform_config(ours.model, ours.meta, None), is_training=False)
    assert torch.equal(pixels[:, :1], torch.stack([our_transform(im) for im in images]))

    with torch.no_grad():
        theirs = model(pixel_values=pixels).logits
    torch.testing.assert_close(theirs, logits_of(ours.model, pixels[:, :1]), rtol=0, atol=LOGIT_TOLERANCE)


def test_automodel_gives_our_pooled_features(mnist_export):
    best, folder = mnist_export
    backbone = AutoModel.from_pretrained(folder).eval()
    ours = load_model(best, task="classification").model
    pixels = torch.randn(2, 1, 36, 44, generator=torch.Generator().manual_seed(0))  # another size
    with torch.no_grad():
        pooled = backbone(pixel_values=pixels.expand(-1, 3, -1, -1)).pooler_output  # (2, embed_dim)
        expected = ours.forward_head(ours.forward_features(pixels), pre_logits=True)
    torch.testing.assert_close(pooled, expected, rtol=0, atol=LOGIT_TOLERANCE)


@pytest.fixture(scope="module")
def timm_export(tmp_path_factory):
    """A WeightFormer made by timm.create_model (no checkpoint: the model's own pretrained preprocessing),
    exported with class names: (the model, the Hub folder)."""
    torch.manual_seed(0)
    ours = timm.create_model("weightformer_tiny", num_classes=4, embed_dim=32, depth=2).eval()
    meta = {"model": "weightformer_tiny", "in_chans": 3, "classes": ["ant", "bee", "cat", "dog"]}
    return ours, to_hf(ours, tmp_path_factory.mktemp("timm") / "wf-timm", meta)


def test_a_timm_created_weightformer_loads_with_its_pretrained_preprocessing(timm_export):
    ours, folder = timm_export
    processor = AutoImageProcessor.from_pretrained(folder)
    model = AutoModelForImageClassification.from_pretrained(folder)
    assert model.config.id2label == dict(enumerate(["ant", "bee", "cat", "dog"]))

    image = photo(300, 260)
    pixels = processor(image)["pixel_values"]  # (1, 3, 224, 224)
    # weightformer_tiny's pretrained_cfg: squash to 224 / 0.875 = 256 on both sides, bicubic, centre 224
    by_hand = np.asarray(image.resize((256, 256), Image.BICUBIC).crop((16, 16, 240, 240)), np.float32) / 255
    expected = ((by_hand - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)[None]
    torch.testing.assert_close(pixels, torch.from_numpy(expected).float(), rtol=0, atol=1e-6)
    meta = {"model": "weightformer_tiny", "in_chans": 3}  # what a model without a checkpoint has
    our_transform = create_transform(**eval_transform_config(ours, meta, None), is_training=False)
    assert torch.equal(pixels, our_transform(image)[None])

    with torch.no_grad():
        theirs = model(pixel_values=pixels).logits
    torch.testing.assert_close(theirs, logits_of(ours, pixels), rtol=0, atol=LOGIT_TOLERANCE)


def test_the_image_classification_pipeline_gives_our_probabilities(timm_export):
    ours, folder = timm_export
    image = photo(300, 260)
    top = transformers.pipeline("image-classification", model=str(folder))(image, top_k=2)
    pixels = AutoImageProcessor.from_pretrained(folder)(image)["pixel_values"]
    probabilities = logits_of(ours, pixels).softmax(-1)[0]  # (4,)
    best = probabilities.argsort(descending=True)[:2].tolist()
    assert [t["label"] for t in top] == [["ant", "bee", "cat", "dog"][i] for i in best]
    np.testing.assert_allclose([t["score"] for t in top], probabilities[best].numpy(), rtol=0, atol=1e-6)


def test_the_pipeline_runs_a_one_channel_model_on_grey_images(mnist_export):
    """The pipeline converts every image to RGB; the exported model takes it, and gives the model's
    probabilities on the grey image (R = G = B: the folded luma weights sum to 1)."""
    best, folder = mnist_export
    image = digits()[0]
    top = transformers.pipeline("image-classification", model=str(folder))(image, top_k=3)
    ours = load_model(best, task="classification")
    transform = create_transform(**eval_transform_config(ours.model, ours.meta, None), is_training=False)
    probabilities = logits_of(ours.model, transform(image)[None]).softmax(-1)[0]  # (10,)
    best3 = probabilities.argsort(descending=True)[:3].tolist()
    assert [t["label"] for t in top] == [str(i) for i in best3]
    np.testing.assert_allclose([t["score"] for t in top], probabilities[best3].numpy(), rtol=0, atol=1e-6)


def test_another_timm_architecture_loads_too(tmp_path):
    """timm writes num_classes into model_args for every model; transformers refused any such folder."""
    torch.manual_seed(0)
    ours = timm.create_model("test_resnet", num_classes=5).eval()
    folder = to_hf(ours, tmp_path / "resnet")
    assert "num_classes" not in json.loads((folder / "config.json").read_text())["model_args"]
    model = AutoModelForImageClassification.from_pretrained(folder)
    pixels = AutoImageProcessor.from_pretrained(folder)(photo(200, 170))["pixel_values"]
    with torch.no_grad():
        theirs = model(pixel_values=pixels).logits
    torch.testing.assert_close(theirs, logits_of(ours, pixels), rtol=0, atol=LOGIT_TOLERANCE)


def test_class_names_of_a_model_timm_read_from_a_hub_folder_are_carried(mnist_export, tmp_path):
    """timm keeps a Hub folder's label names in the model's pretrained_cfg; exported again, they reach
    transformers' id2label."""
    _, folder = mnist_export
    reloaded = timm.create_model(f"local-dir:{folder}", pretrained=True)
    again = to_hf(reloaded, tmp_path / "again")
    model = AutoModelForImageClassification.from_pretrained(again)
    assert model.config.id2label == {i: str(i) for i in range(10)}


def test_without_import_weightformer_transformers_does_not_know_the_architecture(mnist_export):
    """Why the docs say ``import weightformer`` first: transformers asks timm for the architecture
    (5.x: an ImportError that suggests upgrading timm; 4.53: timm's RuntimeError "Unknown model")."""
    _, folder = mnist_export
    script = ("import sys\nfrom transformers import AutoModelForImageClassification\n"
              "try:\n    AutoModelForImageClassification.from_pretrained(sys.argv[1])\n"
              "except (ImportError, RuntimeError) as e:\n    print(e)\nelse:\n    print('loaded')\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "weightformer_tiny" in done.stdout and "loaded" not in done.stdout
