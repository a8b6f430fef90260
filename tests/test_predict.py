"""``weightformer predict``: top-k class names for files and folders, CSV and JSON output, unreadable
files skipped, listed and reported in the exit code."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

import weightformer  # noqa: F401  (registers the models)
from weightformer.classification.predict import EXIT_SKIPPED
from weightformer.cli import main as weightformer_main


def main(argv):
    return weightformer_main(["predict", *argv])

CLASSES = ["circle", "square", "triangle"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A best.pt as training writes it: weights, and meta with the class folders' names."""
    torch.manual_seed(0)
    kwargs = {"patch_size": 4, "embed_dim": 32, "depth": 2, "img_size": 32}
    model = timm.create_model("weightformer_tiny", num_classes=3, **kwargs).eval()
    meta = {"task": "classification", "model": "weightformer_tiny", "model_kwargs": kwargs, "num_classes": 3,
            "in_chans": 3, "img_size": 32, "data": "shapes3", "classes": CLASSES, "mean": [0.5] * 3, "std": [0.25] * 3,
            "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center"}
    path = tmp_path_factory.mktemp("run") / "best.pt"
    torch.save({"model": model.state_dict(), "meta": meta}, path)
    return path, model


@pytest.fixture
def images(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    (folder / "nested").mkdir(parents=True)
    for name in ("a.png", "b.jpg", "nested/c.png"):
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / name)
    return folder


def expected_top(model, path: Path, k: int):
    """The model's top-k for one image, preprocessed by hand: resize to 32 px, scale to [0, 1], normalise."""
    pixels = np.asarray(Image.open(path).convert("RGB").resize((32, 32), Image.BILINEAR), dtype=np.float32) / 255
    x = (torch.from_numpy(pixels).permute(2, 0, 1)[None] - 0.5) / 0.25
    with torch.no_grad():
        probs = model(x).softmax(-1)[0]
    p, i = probs.topk(k)
    return [(CLASSES[c], v) for c, v in zip(i.tolist(), p.tolist())]


def test_folder_to_csv_with_class_names(checkpoint, images, tmp_path, capsys):
    out = tmp_path / "preds.csv"
    code = main([str(images), "--checkpoint", str(checkpoint[0]), "--top-k", "2", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(out.open()))
    assert [Path(r["path"]).name for r in rows] == ["a.png", "a.png", "b.jpg", "b.jpg", "c.png", "c.png"]
    a_png = [(r["label"], float(r["probability"])) for r in rows if r["path"].endswith("a.png")]
    for (label, p), (want_label, want_p) in zip(a_png, expected_top(checkpoint[1], images / "a.png", 2)):
        assert label == want_label and abs(p - want_p) < 1e-4
    captured = capsys.readouterr()
    assert f"{images / 'a.png'}: {a_png[0][0]}" in captured.out
    assert "img/s" in captured.err


def test_unreadable_files_are_skipped_listed_and_change_the_exit_code(checkpoint, images, tmp_path, capsys):
    (images / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "preds.json"
    code = main([str(images / "a.png"), str(images / "broken.png"), "--checkpoint", str(checkpoint[0]),
                 "--out", str(out)])
    assert code == EXIT_SKIPPED
    result = json.loads(out.read_text())
    assert [Path(r["path"]).name for r in result["predictions"]] == ["a.png"]
    assert len(result["predictions"][0]["top"]) == 3  # top-5 of 3 classes
    assert result["skipped"] == [str(images / "broken.png")]
    assert f"skipped 1 unreadable file(s):\n  {images / 'broken.png'}" in capsys.readouterr().err


def test_imagenet_names_for_a_1000_class_model(tmp_path, images, capsys):
    """A bare state dict with --model: ImageNet class descriptions from timm's ImageNetInfo."""
    model = timm.create_model("weightformer_tiny", embed_dim=32, depth=2).eval()
    with torch.no_grad():
        model.head.bias.fill_(0).index_fill_(0, torch.tensor([0]), 50.0)  # class 0 (tench) always wins
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    code = main([str(images / "a.png"), "--checkpoint", str(tmp_path / "weights.pt"), "--model", "weightformer_tiny",
                 "--model-kwargs", "embed_dim=32", "depth=2", "--top-k", "1"])
    assert code == 0
    assert "a.png: tench, Tinca tinca 100.0%" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["{img}"], "no model given"),
    (["{img}", "--checkpoint", "{ckpt}", "--out", "preds.txt"], "must end in .csv or .json"),
    (["{img}", "--checkpoint", "{ckpt}", "--top-k", "0"], "--top-k must be at least 1"),
    (["missing.png", "--checkpoint", "{ckpt}"], "does not exist"),
    (["{img}", "--checkpoint", "{ckpt}", "--out", "old.csv"], "already exists; pass --overwrite"),
    (["{img}", "--checkpoint", "{ckpt}", "--img-size", "3"], "cannot take 3 px images"),
])
def test_mistakes_are_one_line_errors(argv, message, checkpoint, images, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.csv").write_text("kept")
    subst = {"{img}": str(images / "a.png"), "{ckpt}": str(checkpoint[0])}
    assert main([subst.get(a, a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert (tmp_path / "old.csv").read_text() == "kept"


def test_only_unreadable_files_is_an_error(checkpoint, tmp_path, capsys):
    (tmp_path / "x.png").write_bytes(b"")
    assert main([str(tmp_path / "x.png"), "--checkpoint", str(checkpoint[0])]) == 2
    assert "none of the 1 file(s) could be read" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["3", "1"])
def test_an_image_size_below_one_patch_is_one_line_before_any_image_is_read(size, checkpoint, images, tmp_path,
                                                                           monkeypatch, capsys):
    """The check training makes (check_input_size), made before the images are decoded; --out is not written."""
    import weightformer.classification.predict as predict_module

    monkeypatch.setattr(predict_module, "rgb_loader", lambda path: pytest.fail(f"{path} was read"))
    out = tmp_path / "preds.csv"
    assert main([str(images), "--checkpoint", str(checkpoint[0]), "--img-size", size, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: weightformer_tiny cannot take {size} px images") and err.count("\n") == 1
    assert "smaller than one 4x4 patch" in err and "--img-size" in err and not out.exists()
