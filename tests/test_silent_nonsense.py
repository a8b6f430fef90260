"""Settings that make no sense are refused or named, errors name the true cause, and reports name files that
exist: resume into another folder, one-class data, a split evaluated on itself, another probe's labels, grey
images for a grey model, a checkpoint given to ``gen eval``, another dense task's ``--init``, an ablation folder,
one image path in Python, the engine's own model arguments, the settings' type, and a 1-channel model in
transformers' pipeline."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from conftest_train import make_image_folder, single_thread, tiny_config
from weightformer.cli import main
from weightformer.data import open_dataset
from weightformer.engine import train

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model-kwargs", "patch_size=4", "embed_dim=32", "depth=2"]
FLAGS = ["--img-size", "16", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0", *TINY]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=("a", "b"), train_per_class=4, val_per_class=2)


@pytest.fixture(scope="module")
def mnist_best(tmp_path_factory) -> str:
    """A tiny 1-channel classifier of the bundled digits (one step)."""
    root = tmp_path_factory.mktemp("mnist")
    config = tiny_config("mnist", root / "run", img_size=28, epochs=1, max_steps=1, batch_size=8,
                         model_kwargs={"patch_size": 4, "embed_dim": 32, "depth": 2})
    with single_thread():
        return train(config, task="classification").best_checkpoint


def _named_files(out: str) -> list[Path]:
    """The checkpoints a run's final report names: "checkpoint PATH" and the evaluate command's."""
    return [Path(p) for p in re.findall(r"checkpoint (\S+\.pt)", out) + re.findall(r"--checkpoint (\S+)", out)]


def test_a_resumed_run_writes_into_its_folder_and_a_branch_reports_its_own_files(folder, tmp_path, capsys,
                                                                                monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--data", str(folder), "--output", str(a), *FLAGS, "--epochs", "1"]) == 0
    ckpt = torch.load(a / "last.pt", weights_only=True)
    ckpt["progress"]["best_score"] = 100.0  # a best no later epoch beats
    torch.save(ckpt, a / "last.pt")
    capsys.readouterr()
    assert main(["train", "--resume", str(a / "last.pt"), "--output", str(b), "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert "the run continues in" in out and f"checkpoint {b / 'best.pt'}" in out
    assert _named_files(out) and all(path.is_file() for path in _named_files(out)), out
    assert len((b / "metrics.jsonl").read_text().splitlines()) == 1  # the epoch trained in b
    # Without --output the run continues in the checkpoint's own folder.
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", str(a / "last.pt"), "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert f"writing to {a}" in out and not (tmp_path / "runs").exists()
    assert len((a / "metrics.jsonl").read_text().splitlines()) == 2
    assert all(path.is_file() for path in _named_files(out)), out
    # A finished run has nothing left to train: said in its folder, refused into another.
    assert main(["train", "--resume", str(a / "last.pt")]) == 0
    assert "nothing is left to train" in capsys.readouterr().out
    assert main(["train", "--resume", str(a / "last.pt"), "--output", str(tmp_path / "c")]) == 2
    assert "nothing is left to train" in _error_line(capsys) and not (tmp_path / "c").exists()


def test_one_class_is_refused(tmp_path, capsys):
    one = make_image_folder(tmp_path / "one", classes=("a",), train_per_class=4, val_per_class=2)
    assert main(["train", "--data", str(one), "--output", str(tmp_path / "run"), *FLAGS, "--epochs", "1"]) == 2
    assert "needs at least two" in _error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_training_and_evaluating_on_one_split_is_named(tmp_path, capsys):
    from weightformer.detection.config import DetectionConfig
    from weightformer.detection.synthetic import write_shapes
    from weightformer.detection.task import DetectionTask
    from weightformer.engine.config import validate_config
    from weightformer.engine.distributed import DistInfo

    root = write_shapes(tmp_path / "coco", split_sizes={"val": 2})
    cpu = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)
    task = DetectionTask(validate_config(DetectionConfig(data=str(root), train_split="val", val_split="val")))
    task.build_data(cpu)
    out = capsys.readouterr().out
    assert "trains and evaluates on the one split val" in out and "--val-split" in out


def test_transfer_refuses_another_probes_labels_as_eval_does(tmp_path, capsys):
    run = tmp_path / "probe"
    assert main(["train", "--data", "glyph_match:size=32,train=8,val=4", "--output", str(run), *FLAGS,
                 "--img-size", "32", "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run / "best.pt"), "--data", "glyph_count:size=32,val=4",
                 "--workers", "0"]) == 2
    eval_error = _error_line(capsys)
    assert main(["analyze", "transfer", "--model", f"ckpt={run / 'best.pt'}", "--data", "glyph_count",
                 "--sizes", "32", "--val", "4", "--output", str(tmp_path / "t.png")]) == 2
    error = _error_line(capsys)
    assert "has 2 classes" in error and "has 4" in error and "has 2 classes" in eval_error
    assert not (tmp_path / "t.png").exists()


@pytest.fixture(scope="module")
def grey_digits(tmp_path_factory) -> Path:
    """An ImageFolder val/ split of ten "L" PNG digits, one per class folder 0-9."""
    _, splits = open_dataset("mnist", splits=("val",), warn=False)
    data = tmp_path_factory.mktemp("digits")
    for label in range(10):
        index = int(np.flatnonzero(splits["val"].labels == label)[0])
        (data / "val" / str(label)).mkdir(parents=True)
        splits["val"][index][0].save(data / "val" / str(label) / f"{index}.png")
    return data


def test_eval_reads_grey_pngs_for_a_grey_model_as_predict_does(mnist_best, grey_digits, tmp_path):
    assert main(["eval", "--checkpoint", mnist_best, "--data", str(grey_digits), "--workers", "0",
                 "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["num_samples"] == 10


def test_gen_eval_of_a_checkpoint_says_what_it_is(tmp_path, capsys):
    pt = tmp_path / "last.pt"
    torch.save({"model": {"w": torch.zeros(2)}}, pt)
    assert main(["gen", "eval", str(pt)]) == 2
    error = _error_line(capsys)
    assert "PyTorch file" in error and "samples.npz" in error and "not a file in the archive" not in error
    np.savez(tmp_path / "half.npz", images=np.zeros((2, 8, 8, 1), np.uint8))
    assert main(["gen", "eval", str(tmp_path / "half.npz")]) == 2
    error = _error_line(capsys)
    assert "has no labels array" in error and "not a file" not in error


def test_init_from_a_detection_checkpoint_loads_its_backbone_into_segmentation(tmp_path):
    from weightformer.detection.task import BACKBONE_PATH as DET_BACKBONE
    from weightformer.engine.config import validate_config
    from weightformer.engine.distributed import DistInfo
    from weightformer.segmentation.config import SegmentationConfig
    from weightformer.segmentation.synthetic import write_shapes
    from weightformer.segmentation.task import BACKBONE_PATH as SEG_BACKBONE, SegmentationTask

    backbone = timm.create_model("weightformer_tiny", num_classes=0, embed_dim=32, depth=2).state_dict()
    detector = {f"{DET_BACKBONE}.{k}": v + 1 for k, v in backbone.items()}
    detector["roi_heads.box_predictor.cls_score.weight"] = torch.zeros(3, 8)
    ckpt = {"meta": {"task": "detection", "model": "weightformer_tiny"}, "model": detector}
    cpu = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_process_group=False)
    kwargs = {"embed_dim": 32, "depth": 2, "channels": 16, "pyramid_channels": 16, "aux_channels": 8}
    task = SegmentationTask(validate_config(SegmentationConfig(
        data=str(write_shapes(tmp_path / "seg", train=2, val=1)), model_kwargs=kwargs, img_size=32, num_classes=4)))
    model, meta = task.build_model(task.build_data(cpu), torch.device("cpu"))
    assert "only its backbone" in task.init_weights(model, meta, ckpt, "--init det.pt")
    loaded = model.get_submodule(SEG_BACKBONE).state_dict()
    assert all(torch.equal(loaded[k], backbone[k] + 1) for k in loaded)
    # A classifier takes the same backbone; its head starts fresh.
    from weightformer.classification.config import ClassificationConfig
    from weightformer.classification.task import ClassificationTask

    classifier = ClassificationTask(validate_config(ClassificationConfig(data="mnist")))
    net = timm.create_model("weightformer_tiny", num_classes=2, embed_dim=32, depth=2)
    head = net.head.weight.clone()
    assert "the classifier starts fresh" in classifier.init_weights(net, {}, ckpt, "--init det.pt")
    weights = net.state_dict()
    assert torch.equal(weights["head.weight"], head)
    assert all(torch.equal(weights[k], backbone[k] + 1) for k in backbone)


def test_ablate_on_a_folder_says_it_is_a_folder(tmp_path, capsys):
    assert main(["ablate", str(tmp_path)]) == 2
    error = _error_line(capsys)
    assert "is a folder" in error and "does not exist" not in error


def test_one_image_path_is_one_image_in_every_predict_function(mnist_best, tmp_path):
    from weightformer.classification.predict import predict as classify
    from weightformer.detection.predict import predict as detect
    from weightformer.engine import load_model
    from weightformer.checkpoint import CheckpointError

    image = tmp_path / "digit.png"
    Image.fromarray(np.full((28, 28), 200, np.uint8)).save(image)
    result = classify(load_model(mnist_best, task="classification"), str(image), top_k=1)
    assert [row[0] for row in result.rows] == [str(image)]
    with pytest.raises(CheckpointError, match="missing.pt does not exist"):  # the image was found, as one image
        detect(tmp_path / "missing.pt", str(image))
    dense = (ROOT / "docs" / "dense.md").read_text()
    assert "`weightformer.detection.predict(" not in dense and "weightformer.detection.predict.predict(" in dense


def test_num_classes_in_model_kwargs_is_accepted_when_it_agrees_and_else_named(mnist_best, grey_digits, capsys):
    base = ["eval", "--checkpoint", mnist_best, "--data", str(grey_digits), "--workers", "0", "--model",
            "weightformer_tiny", "--model-kwargs"]
    assert main([*base, "num_classes=10"]) == 0
    capsys.readouterr()
    assert main([*base, "num_classes=5"]) == 2
    error = _error_line(capsys)
    assert "num_classes comes from" in error and "(10 here)" in error and "does not take" not in error


def test_train_with_a_name_instead_of_settings_is_a_type_error():
    with pytest.raises(TypeError, match=r"a mapping such as \{'data': 'mnist'\}.*got the str 'mnist'"):
        train("mnist", task="classification")


def test_the_pipeline_runs_an_exported_grey_model_on_rgb_images_as_the_model_on_their_luma(mnist_best, tmp_path,
                                                                                         monkeypatch):
    """PIL's "L" rounds the luma to 8 bits before the model sees it; the folded stem sees it unrounded (and
    the RGB resize rounds each channel): at most about 1.5 grey levels apart, which moved the probabilities of
    a 200-step model by at most 2.1e-5 over 64 random RGB images."""
    transformers = pytest.importorskip("transformers")
    import huggingface_hub.constants as hub_constants
    from timm.data import create_transform

    from weightformer.classification.evaluate import eval_transform_config
    from weightformer.engine import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket.socket, "connect", lambda *a, **k: pytest.fail("a network connection was attempted"))
    folder = tmp_path / "hub"
    assert main(["export", "--checkpoint", mnist_best, "--format", "hf", "--out", str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["model_args"]["in_chans"] == 3 and config["pretrained_cfg"]["input_size"][0] == 3

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (34, 40, 3), dtype=np.uint8), "RGB") for _ in range(3)]
    ours = load_model(mnist_best, task="classification")
    transform = create_transform(**eval_transform_config(ours.model, ours.meta, None), is_training=False)
    with torch.no_grad():
        expected = ours.model(torch.stack([transform(im.convert("L")) for im in images])).softmax(-1)  # (3, 10)
    classify = transformers.pipeline("image-classification", model=str(folder))
    for image, probabilities in zip(images, expected):
        top = classify(image, top_k=10)
        got = torch.tensor([t["score"] for t in sorted(top, key=lambda t: int(t["label"]))])
        torch.testing.assert_close(got, probabilities, rtol=0, atol=1e-3)
    # On grey images (R = G = B) there is no luma rounding: the same up to float arithmetic.
    grey = Image.fromarray(rng.integers(0, 256, (34, 40), dtype=np.uint8), "L")
    top = classify(grey.convert("RGB"), top_k=10)
    got = torch.tensor([t["score"] for t in sorted(top, key=lambda t: int(t["label"]))])
    with torch.no_grad():
        exact = ours.model(transform(grey)[None]).softmax(-1)[0]
    torch.testing.assert_close(got, exact, rtol=0, atol=1e-5)
