"""``weightformer export``: the Hub layout loads back in timm (local folder and offline Hub cache) with the
same logits, ONNX runs in onnxruntime at other batch and image sizes, a ``.pt2`` runs in a fresh process,
and mistakes are one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import timm
import torch

import weightformer  # noqa: F401  (registers the models)
from weightformer.export import to_hf
from weightformer.export.cli import main as export_main

CLASSES = ["circle", "square", "triangle"]


def save_checkpoint(path: Path, model_kwargs: dict, img_size: int, with_metrics: bool = True) -> torch.nn.Module:
    """A best.pt as ``weightformer train`` writes it (weights, meta, config, validation metrics)."""
    torch.manual_seed(0)
    model = timm.create_model("weightformer_tiny", num_classes=3, **model_kwargs).eval()
    meta = {"task": "classification", "model": "weightformer_tiny", "model_kwargs": model_kwargs, "num_classes": 3,
            "in_chans": 3, "img_size": img_size, "data": "shapes3", "classes": CLASSES, "mean": [0.5, 0.4, 0.3],
            "std": [0.2, 0.25, 0.3], "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center"}
    ckpt = {"model": model.state_dict(), "ema": None, "meta": meta, "epoch": 3, "global_step": 30,
            "config": {"data": "shapes3", "model": "weightformer_tiny", "epochs": 3, "lr": 0.002, "seed": 7}}
    if with_metrics:
        ckpt.update(val_top1=66.7, val_top5=100.0, val_loss=0.7)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return model


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A 32 px, patch-4 model (fast), with the run's metrics.jsonl beside it."""
    run = tmp_path_factory.mktemp("run")
    model = save_checkpoint(run / "best.pt", {"patch_size": 4, "embed_dim": 32, "depth": 2, "img_size": 32}, 32)
    lines = [{"epoch": e, "val_top1": t, "val_top5": 100.0, "val_loss": 1.0 / e} for e, t in ((1, 50.0), (2, 83.3), (3, 60.0))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run / "best.pt", model


@pytest.fixture(scope="module")
def hf_folder(small_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "wf-shapes"
    with mock.patch.object(sys, "argv", ["weightformer", "export", "--checkpoint", str(small_checkpoint[0])]):
        assert export_main(["--checkpoint", str(small_checkpoint[0]), "--format", "hf", "--out", str(out)]) == 0
    return out


def logits(model, shape=(2, 3, 40, 36)):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.eval()(x)


def test_hf_layout_and_local_dir_round_trip(hf_folder, small_checkpoint):
    assert sorted(os.listdir(hf_folder)) == ["README.md", "config.json", "model.safetensors"]
    config = json.loads((hf_folder / "config.json").read_text())
    assert config["architecture"] == "weightformer_tiny" and config["num_classes"] == 3
    assert config["label_names"] == CLASSES
    assert config["model_args"]["patch_size"] == 4 and config["model_args"]["embed_dim"] == 32
    cfg = config["pretrained_cfg"]
    assert cfg["input_size"] == [3, 32, 32] and cfg["mean"] == [0.5, 0.4, 0.3] and cfg["interpolation"] == "bilinear"
    loaded = timm.create_model(f"local-dir:{hf_folder}", pretrained=True)
    torch.testing.assert_close(logits(loaded), logits(small_checkpoint[1]), rtol=0, atol=0)
    assert tuple(timm.data.resolve_data_config({}, model=loaded)["std"]) == (0.2, 0.25, 0.3)


def test_hf_model_card_has_metrics_and_command(hf_folder, small_checkpoint):
    card = (hf_folder / "README.md").read_text()
    assert "library_name: timm" in card
    assert "top1: 83.3" in card  # the best epoch of metrics.jsonl, not the checkpoint's last numbers
    assert "(epoch 2)" in card
    assert f"weightformer export --checkpoint {small_checkpoint[0]}" in card
    assert "lr: 0.002" in card and "seed: 7" in card


def test_hf_hub_id_from_offline_cache(hf_folder, small_checkpoint, tmp_path, monkeypatch):
    """Lay the folder out as huggingface_hub's cache of ORG/NAME, then load it by Hub id, offline."""
    repo = tmp_path / "hub" / "models--my-org--wf-shapes"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name in os.listdir(hf_folder):
        (snapshot / name).write_bytes((hf_folder / name).read_bytes())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = timm.create_model("hf-hub:my-org/wf-shapes", pretrained=True)
    torch.testing.assert_close(logits(loaded), logits(small_checkpoint[1]), rtol=0, atol=0)
    assert loaded.pretrained_cfg["label_names"] == CLASSES


def test_push_to_hub_uploads_the_folder(small_checkpoint, tmp_path, capsys):
    out = tmp_path / "card"
    with mock.patch("huggingface_hub.HfApi.create_repo") as create, \
            mock.patch("huggingface_hub.HfApi.upload_folder") as upload:
        create.return_value = mock.Mock(repo_id="my-org/wf-shapes")
        upload.return_value = mock.Mock(commit_url="https://huggingface.co/my-org/wf-shapes/commit/1")
        code = export_main(["--checkpoint", str(small_checkpoint[0]), "--format", "hf", "--out", str(out),
                            "--push-to-hub", "my-org/wf-shapes", "--private"])
    assert code == 0
    create.assert_called_once_with("my-org/wf-shapes", private=True, exist_ok=True)
    assert upload.call_args.kwargs["folder_path"] == str(out) and upload.call_args.kwargs["repo_id"] == "my-org/wf-shapes"
    assert 'hf-hub:my-org/wf-shapes' in (out / "README.md").read_text()
    assert "uploaded to https://huggingface.co/my-org/wf-shapes" in capsys.readouterr().out


def test_to_hf_refuses_a_folder_with_files(tmp_path, small_checkpoint):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists; pass --overwrite"):
        to_hf(small_checkpoint[1], tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.fixture(scope="module")
def exported_224(tmp_path_factory):
    """One ONNX and one .pt2 export of a patch-16 model trained at 224 px, through the command line."""
    folder = tmp_path_factory.mktemp("export224")
    model = save_checkpoint(folder / "best.pt", {"embed_dim": 32, "depth": 2, "img_size": 224}, 224, with_metrics=False)
    for fmt in ("onnx", "pt2"):
        assert export_main(["--checkpoint", str(folder / "best.pt"), "--format", fmt,
                            "--out", str(folder / f"model.{fmt}")]) == 0
    return folder, model


@pytest.mark.parametrize("shape", [(2, 3, 224, 224), (1, 3, 320, 256), (3, 3, 208, 272), (1, 3, 96, 160)])
def test_onnx_runs_at_every_size(exported_224, shape):
    import onnxruntime as ort

    folder, model = exported_224
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [d for d in session.get_inputs()[0].shape] == ["batch", 3, "height", "width"]
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    got = session.run(["logits"], {"images": x})[0]
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    assert got.shape == (shape[0], 3)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


def test_pt2_runs_in_a_fresh_process(exported_224, tmp_path):
    folder, model = exported_224
    inputs = [torch.randn(1, 3, 320, 256), torch.randn(3, 3, 208, 272)]
    torch.save(inputs, tmp_path / "inputs.pt")
    script = ("import sys, torch\n"  # no weightformer import: the program stands alone
              "program = torch.export.load(sys.argv[1]).module()\n"
              "inputs = torch.load(sys.argv[2])\n"
              "torch.save([program(x) for x in inputs], sys.argv[3])\n")
    subprocess.run([sys.executable, "-c", script, str(folder / "model.pt2"), str(tmp_path / "inputs.pt"),
                    str(tmp_path / "outputs.pt")], check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    outputs = torch.load(tmp_path / "outputs.pt")
    for x, y in zip(inputs, outputs):
        with torch.no_grad():
            torch.testing.assert_close(y, model(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("argv, message", [
    (["--model", "weightformer_tiny", "--format", "onnx", "--out", "x.onnx"], "no weights to export"),
    (["--checkpoint", "{ckpt}", "--pretrained", "--format", "onnx", "--out", "x.onnx"], "pass one of them"),
    (["--checkpoint", "{ckpt}", "--format", "onnx", "--out", "x.onnx", "--push-to-hub", "a/b"], "use it with --format hf"),
    (["--checkpoint", "{ckpt}", "--format", "hf", "--out", "x", "--aoti"], "use it with --format pt2"),
    (["--checkpoint", "missing.pt", "--format", "pt2", "--out", "x.pt2"], "does not exist"),
    (["--checkpoint", "{ckpt}", "--format", "onnx", "--out", "{ckpt}"], "would write over the command's input"),
    # an image smaller than one 4x4 patch: the model's own refusal, as training gives it
    (["--checkpoint", "{ckpt}", "--format", "onnx", "--out", "x.onnx", "--img-size", "2"], "cannot take 2 px images"),
    (["--checkpoint", "{ckpt}", "--format", "pt2", "--out", "x.onnx", "--img-size", "3"], "cannot take 3 px images"),
    # a 2x2 token grid: the trace would bake in the small grid's code paths (onnxruntime failed, the .pt2 took 8 px only)
    (["--checkpoint", "{ckpt}", "--format", "onnx", "--out", "x.onnx", "--img-size", "8"], "pass --img-size 16 or more"),
    (["--checkpoint", "{ckpt}", "--format", "pt2", "--out", "x.onnx", "--img-size", "12"], "pass --img-size 16 or more"),
    # opsets the exporter cannot write: 1 wrote an opset-18 file with exit 0, 26 an invalid one
    (["--checkpoint", "{ckpt}", "--format", "onnx", "--out", "x.onnx", "--opset", "1"], "writes ONNX opsets 18 to"),
    (["--checkpoint", "{ckpt}", "--format", "onnx", "--out", "x.onnx", "--opset", "17"], "writes ONNX opsets 18 to"),
    (["--checkpoint", "{ckpt}", "--format", "onnx", "--out", "x.onnx", "--opset", "1000"], "writes ONNX opsets 18 to"),
    (["--checkpoint", "{ckpt}", "--format", "pt2", "--out", "x.onnx", "--opset", "18"], "use it with --format onnx"),
    (["--checkpoint", "{ckpt}", "--format", "pt2", "--out", "x.onnx", "--no-check"], "use it with --format onnx"),
    (["--checkpoint", "{ckpt}", "--format", "hf", "--out", "x", "--img-size", "64"], "the hf format traces nothing"),
])
def test_mistakes_are_one_line_errors(argv, message, small_checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = export_main([a.replace("{ckpt}", str(small_checkpoint[0])) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "x").exists()


def test_detection_checkpoint_is_refused(tmp_path, capsys):
    torch.save({"model": {}, "meta": {"task": "detection", "model": "weightformer_tiny"}}, tmp_path / "det.pt")
    assert export_main(["--checkpoint", str(tmp_path / "det.pt"), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]) == 2
    assert "is a detection checkpoint" in capsys.readouterr().err


def test_a_bad_flag_is_one_line_naming_the_command(capsys):
    with pytest.raises(SystemExit) as stop:
        export_main(["--format", "onnx", "--out", "x.onnx", "--bogus"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: weightformer export: unrecognized arguments: --bogus")


def test_opset_range_is_what_this_torch_onnx_writes():
    from torch.onnx._internal.exporter import _constants

    from weightformer.export.onnx import onnx_opsets

    opsets = onnx_opsets()
    assert opsets.start == _constants.TORCHLIB_OPSET == 18  # below it the exporter kept 18 and said nothing
    assert 20 in opsets and opsets.stop - 1 >= 23  # its default, and torch.onnx's ONNX_MAX_OPSET


def test_onnx_is_written_at_the_opset_asked_for(small_checkpoint, tmp_path, capsys):
    import onnx

    out = tmp_path / "m.onnx"
    assert export_main(["--checkpoint", str(small_checkpoint[0]), "--format", "onnx", "--out", str(out),
                        "--opset", "19", "--no-check"]) == 0
    assert [e.version for e in onnx.load(str(out)).opset_import if e.domain in ("", "ai.onnx")] == [19]


def test_an_opset_the_converter_gives_up_on_is_refused_not_written(small_checkpoint, tmp_path):
    """Should a range drift from what the converter does, the file's own opset is checked: the exporter
    asked for 17 keeps its own 18, which is an error, and no file is left."""
    from weightformer.engine.errors import ConfigError
    from weightformer.export import onnx as export_onnx

    with mock.patch.object(export_onnx, "onnx_opsets", return_value=range(17, 26)), \
            pytest.raises(ConfigError, match="could not convert this model to opset 17 and wrote opset 18"):
        export_onnx.to_onnx(small_checkpoint[1], tmp_path / "m.onnx", 3, 32, opset=17, check=False)
    assert os.listdir(tmp_path) == []


def _fixed_size_vit(path: Path) -> None:
    """A DeiT checkpoint trained at 64 px: its position embeddings fix the input size."""
    kwargs = {"img_size": 64, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", num_classes=3, **kwargs)
    meta = {"task": "classification", "model": "deit_tiny_patch16_224", "model_kwargs": kwargs, "num_classes": 3,
            "in_chans": 3, "img_size": 64, "data": "shapes3", "classes": CLASSES, "mean": [0.5] * 3, "std": [0.2] * 3,
            "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center"}
    torch.save({"model": model.state_dict(), "meta": meta}, path)


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_a_model_that_takes_one_size_only_is_refused_before_tracing(fmt, tmp_path, capsys):
    """A fixed-size ViT is refused in one line before tracing, in both formats: no ONNX traceback, no .pt2
    fixed at one size and called dynamic."""
    _fixed_size_vit(tmp_path / "deit.pt")
    code = export_main(["--checkpoint", str(tmp_path / "deit.pt"), "--format", fmt, "--out", str(tmp_path / f"m.{fmt}")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "takes 64x64 px images but not" in err and "dynamic_img_size=true dynamic_img_pad=true" in err
    assert not (tmp_path / f"m.{fmt}").exists()


def test_the_fixed_size_hint_exports_a_program_that_takes_other_sizes(tmp_path):
    _fixed_size_vit(tmp_path / "deit.pt")
    assert export_main(["--checkpoint", str(tmp_path / "deit.pt"), "--format", "pt2", "--out", str(tmp_path / "m.pt2"),
                        "--model-kwargs", "dynamic_img_size=true", "dynamic_img_pad=true"]) == 0
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    assert program(torch.randn(2, 3, 80, 72)).shape == (2, 3)


def test_the_led_form_with_background_padding_exports_to_onnx(tmp_path):
    """Medians as sorts (layers.dynamic_layer.lower_median: median polish and the padding's fill): onnxruntime
    matches PyTorch at another batch and size. docs/analysis.md §6's led form, convs padded with the canvas."""
    from weightformer.export import onnx as export_onnx

    torch.manual_seed(0)
    model = timm.create_model("weightformer_long_range_tiny", patch_size=4, embed_dim=16, depth=1, num_classes=3,
                              linear_predictor="double_centered_gated_led", dwc_predictor="offset_corr",
                              dwc_static_led=True, dwc_padding="background")
    diffs = export_onnx.to_onnx(model, tmp_path / "m.onnx", 3, 32, check_at=[(2, 48, 40)])
    assert len(diffs) == 1 and max(diffs.values()) < 1e-4
