"""``weightformer det train|eval|predict`` end to end on a few images of the offline shapes set, and on
checkpoints of the legacy format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest_train import single_thread
from weightformer.cli import main
from weightformer.detection import recipes, synthetic
from weightformer.engine.metrics import read_metrics

SMALL_SPLITS = {"train": 8, "val": 4}
LEGACY = Path(__file__).resolve().parent / "data" / "legacy_checkpoints"  # written by commit 85154e8
# A detector small enough for a step in a fraction of a second on one core.
TINY = ["--model-kwargs", "embed_dim=32", "depth=2", "conv_dim=16", "fc_dim=32", "rpn_pre_nms_top_n_train=100",
        "rpn_post_nms_top_n_train=32", "rpn_pre_nms_top_n_test=50", "rpn_post_nms_top_n_test=16",
        "box_batch_size_per_image=16", "--img-size", "64", "--batch-size", "2", "--workers", "0", "--device", "cpu",
        "--log-interval", "1000"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic.write_shapes(tmp_path_factory.mktemp("shapes") / "data", seed=1, split_sizes=SMALL_SPLITS)


@pytest.fixture(scope="module")
def trained(shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch of a plain Mask R-CNN, then two images drawn."""
    output = tmp_path_factory.mktemp("run")
    with single_thread():
        assert main(["det", "train", "--data", str(shapes), "--output", str(output), "--epochs", "1", "--visualize", "2",
                     *TINY]) == 0
    return output


def test_train_writes_the_run_and_draws_val_images(trained: Path, capsys):
    record = read_metrics(trained / "metrics.jsonl")[-1]
    for name in ("bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "segm_mAP", "segm_mAP_50"):
        assert 0.0 <= record[f"val_{name}"] <= 100.0
    assert record["val_images"] == SMALL_SPLITS["val"]
    for name in ("last.pt", "best.pt", "curves.png", "config.yaml"):
        assert (trained / name).is_file()
    meta = torch.load(trained / "best.pt", weights_only=True)["meta"]
    assert meta["task"] == "detection" and meta["model"] == "weightformer_tiny" and not meta["cascade"]
    assert meta["classes"] == ["circle", "square", "triangle"] and meta["num_classes"] == 3
    assert meta["detector_kwargs"]["conv_dim"] == 16 and "conv_dim" not in meta["model_kwargs"] and meta["img_size"] == 64
    assert len(list((trained / "visualize").glob("*.png"))) == 2


def test_cascade_with_layer_decay_and_more_classes_trains(shapes: Path, tmp_path: Path):
    assert main(["det", "train", "--data", str(shapes), "--output", str(tmp_path), "--epochs", "2", "--max-steps", "2",
                 "--cascade", "--layer-decay", "0.8", "--num-classes", "5", *TINY]) == 0
    ckpt = torch.load(tmp_path / "last.pt", weights_only=True)
    assert ckpt["meta"]["cascade"] and ckpt["global_step"] == 2
    assert ckpt["meta"]["classes"] == ["circle", "square", "triangle", "class4", "class5"]
    assert ckpt["model"]["roi_heads.stages.0.box_predictor.cls_score.weight"].shape[0] == 6  # 5 + background
    assert any(k.startswith("roi_heads.stages.2.") for k in ckpt["model"])
    assert len(ckpt["optimizer"]["param_groups"]) > 2  # one per backbone layer, plus the heads
    assert "val_bbox_mAP" in read_metrics(tmp_path / "metrics.jsonl")[-1]


def test_resume_with_another_detector_is_one_error_line(trained: Path, shapes: Path, capsys):
    code = main(["det", "train", "--data", str(shapes), "--output", str(trained), "--resume", "auto", "--cascade",
                 "--epochs", "2", *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "cascade" in err[0]


def test_eval_prints_the_metrics_and_writes_json(trained: Path, tmp_path: Path, capsys):
    out_json = tmp_path / "eval.json"
    code = main(["det", "eval", "--checkpoint", str(trained / "best.pt"), "--device", "cpu", "--workers", "0",
                 "--json", str(out_json), "--visualize", "1", "--out", str(tmp_path / "drawn")])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result == json.loads(out_json.read_text())
    assert result["images"] == SMALL_SPLITS["val"]
    for name in ("bbox_mAP", "bbox_mAP_50", "bbox_mAP_75", "segm_mAP", "segm_mAP_50"):
        assert 0.0 <= result[name] <= 100.0 and name in out
    for kind in ("bbox", "segm"):  # each category's AP, named, under the means
        assert set(result[f"{kind}_AP_per_category"]) == {"circle", "square", "triangle"}
        assert f"{kind} AP per category: circle " in out
    # the same weights score the same as at the end of training
    assert result["bbox_mAP"] == pytest.approx(read_metrics(trained / "metrics.jsonl")[-1]["val_bbox_mAP"], abs=1e-3)
    assert len(list((tmp_path / "drawn").glob("*.png"))) == 1


def test_eval_refuses_an_unwritable_json_path_before_the_work(trained: Path, tmp_path: Path, capsys):
    code = main(["det", "eval", "--checkpoint", str(trained / "best.pt"), "--json", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--json" in err[0]


def test_predict_draws_and_lists_detections(trained: Path, shapes: Path, tmp_path: Path, capsys):
    images = sorted((shapes / "images" / "val").glob("*.png"))[:2]
    out = tmp_path / "pred"
    assert main(["det", "predict", "--checkpoint", str(trained / "last.pt"), *map(str, images), "--out", str(out),
                 "--score-threshold", "0.0", "--device", "cpu"]) == 0
    records = json.loads((out / "detections.json").read_text())
    assert [r["image"] for r in records] == [str(p) for p in images]
    assert all(Path(r["drawn"]).is_file() for r in records)
    for detection in (d for r in records for d in r["detections"]):
        assert detection["label"] in ("circle", "square", "triangle") and len(detection["box_xyxy"]) == 4
    assert "detection(s)" in capsys.readouterr().out


def test_predict_replaces_its_earlier_files_only_with_overwrite(trained: Path, shapes: Path, tmp_path: Path, capsys):
    image = str(sorted((shapes / "images" / "val").glob("*.png"))[0])
    out = tmp_path / "pred"
    command = ["det", "predict", "--checkpoint", str(trained / "last.pt"), image, "--out", str(out), "--device", "cpu"]
    assert main(command) == 0
    (out / "detections.json").write_text("mine")
    capsys.readouterr()
    assert main(command) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds detections.json" in err[0] and "--overwrite" in err[0]
    assert (out / "detections.json").read_text() == "mine"
    assert main([*command, "--overwrite"]) == 0
    assert json.loads((out / "detections.json").read_text())[0]["image"] == image


def test_eval_and_predict_read_a_checkpoint_of_the_old_format(shapes: Path, tmp_path: Path, capsys):
    """A legacy-format best.pt of ``weightformer det train``: no split names in its config."""
    best = LEGACY / "det" / "best.pt"
    ckpt = torch.load(best, weights_only=True)
    assert "val_split" not in ckpt["config"] and ckpt["meta"]["task"] == "detection"
    code = main(["det", "eval", "--checkpoint", str(best), "--data", str(shapes), "--device", "cpu", "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["images"] == SMALL_SPLITS["val"] and result["split"] == "val" and 0 <= result["bbox_mAP"] <= 100
    image = sorted((shapes / "images" / "val").glob("*.png"))[0]
    assert main(["det", "predict", "--checkpoint", str(best), str(image), "--out", str(tmp_path / "pred"),
                 "--score-threshold", "0", "--device", "cpu"]) == 0
    records = json.loads((tmp_path / "pred" / "detections.json").read_text())
    assert records[0]["image"] == str(image)
    assert all(d["label"] in ckpt["meta"]["classes"] for d in records[0]["detections"])


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_a_classification_checkpoint_is_the_one_wrong_task_line(command: str, shapes: Path, tmp_path: Path, capsys):
    checkpoint = str(LEGACY / "cls" / "best.pt")
    image = str(sorted((shapes / "images" / "val").glob("*.png"))[0])
    rest = ["--data", str(shapes)] if command == "eval" else [image, "--out", str(tmp_path / "pred")]
    assert main(["det", command, "--checkpoint", checkpoint, "--device", "cpu", *rest]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {checkpoint} is a classification checkpoint, not a detection one; use it with weightformer "
                   f"(e.g. weightformer eval --checkpoint {checkpoint})"]


def test_weights_without_a_description_are_refused_in_one_line(trained: Path, tmp_path: Path, capsys):
    bare = tmp_path / "bare.pt"
    torch.save(torch.load(trained / "best.pt", weights_only=True)["model"], bare)
    assert main(["det", "eval", "--checkpoint", str(bare), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without the description of a detection model" in err[0]


def test_predict_on_a_missing_image_is_one_error_line(trained: Path, tmp_path: Path, capsys):
    code = main(["det", "predict", "--checkpoint", str(trained / "last.pt"), str(tmp_path / "nope.png"),
                 "--out", str(tmp_path / "pred")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "nope.png" in err[0]


def test_fewer_classes_than_the_data_is_one_error_line(shapes: Path, tmp_path: Path, capsys):
    code = main(["det", "train", "--data", str(shapes), "--output", str(tmp_path), "--num-classes", "2", *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "num_classes 2" in err[0]


def test_a_coco_file_naming_a_missing_image_is_one_error_line(shapes: Path, tmp_path: Path, capsys):
    broken = synthetic.write_shapes(tmp_path / "broken", seed=2, split_sizes={"train": 3, "val": 2})
    next((broken / "images" / "train").glob("*.png")).unlink()
    code = main(["det", "train", "--data", str(broken), "--output", str(tmp_path / "run"), *TINY])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "not in" in err[0]


def test_without_data_it_trains_on_the_cached_shapes_set(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(synthetic, "SPLIT_SIZES", SMALL_SPLITS)
    assert main(["det", "train", "--output", str(tmp_path / "run"), "--max-steps", "1", *TINY]) == 0
    out = capsys.readouterr().out
    epochs = recipes.recipe("shapes.yaml").values["epochs"]
    assert "defaults for shapes" in out and f"epochs={epochs}" in out  # the small-CPU recipe, minus what the flags set
    root = synthetic.cache_root()
    assert root.parent == tmp_path / "cache" / "weightformer"
    assert len(list((root / "images" / "train").glob("*.png"))) == SMALL_SPLITS["train"]
    assert [p.name for p in root.parent.iterdir()] == [root.name]  # no staging folder left behind
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["meta"]["data"] == "shapes"


@pytest.mark.parametrize("command", ["train", "eval", "predict"])
def test_help_shows_the_defaults(command: str, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["det", command, "--help"])
    assert exit_info.value.code == 0
    assert "default" in capsys.readouterr().out


def test_the_task_help_speaks_of_detection(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["det", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "Mask R-CNN" in out and "{train,eval,predict}" in out
