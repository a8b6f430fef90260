"""Non-finite weights and outputs are never results: a checkpoint with NaN or Inf weights (model or EMA) is refused
by every command that reads it, naming the tensor; non-finite outputs of finite weights are an error, not a score;
every JSON the project writes is strict JSON (no NaN, no Infinity)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import weightformer.engine.weights as weights_module
from conftest_train import make_image_folder, single_thread
from weightformer.cli import main
from weightformer.detection import synthetic as det_synthetic
from weightformer.engine.metrics import json_text
from weightformer.segmentation.synthetic import write_shapes as write_seg_shapes

pytestmark = pytest.mark.usefixtures("one_thread")

CPU = ["--device", "cpu", "--workers", "0"]
ONE_STEP = [*CPU, "--epochs", "1", "--max-steps", "1", "--warmup-epochs", "0", "--log-interval", "1000", "--ema"]
TRAIN = {  # task: (its command prefix, flags of a tiny run)
    "cls": ([], ["--img-size", "16", "--batch-size", "4", "--model-kwargs", "patch_size=4", "embed_dim=16",
                 "depth=1"]),
    "det": (["det"], ["--img-size", "64", "--batch-size", "2", "--model-kwargs", "embed_dim=32", "depth=2",
                      "conv_dim=16", "fc_dim=32", "rpn_pre_nms_top_n_test=50", "rpn_post_nms_top_n_test=16",
                      "box_batch_size_per_image=16"]),
    "seg": (["seg"], ["--img-size", "32", "--batch-size", "4", "--inference", "slide", "--crop", "32", "--stride",
                      "16", "--model-kwargs", "embed_dim=32", "depth=2", "channels=16", "pyramid_channels=16",
                      "aux_channels=8"]),
    "gen": (["gen"], ["--img-size", "16", "--batch-size", "4", "--model", "wf_dit_s_4", "--model-kwargs",
                      "hidden_size=32", "depth=2"]),
}


def strict_json(text: str):
    """``json.loads`` that refuses NaN and Infinity, as strict JSON parsers do."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON: {text[:200]}"))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    write_seg_shapes(root / "seg" / "ADEChallengeData2016", train=4, val=2)
    folder = make_image_folder(root / "cls", classes=("a", "b"), train_per_class=4, val_per_class=2)
    return {"cls": folder, "gen": folder, "seg": root / "seg",
            "det": det_synthetic.write_shapes(root / "det", seed=1, split_sizes={"train": 2, "val": 2})}


@pytest.fixture(scope="module")
def runs(data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A one-step run of each task (EMA kept), its last.pt."""
    out = {}
    with single_thread():
        for task, (prefix, flags) in TRAIN.items():
            output = tmp_path_factory.mktemp(f"run_{task}")
            assert main([*prefix, "train", "--data", str(data[task]), "--output", str(output), *ONE_STEP, *flags]) == 0
            out[task] = output
    return out


def corrupt(run: Path, part: str, value: float, path: Path) -> tuple[Path, str]:
    """A copy of ``run``'s last.pt with one ``value`` in its ``part`` ("model" or "ema"); and that tensor's name."""
    checkpoint = torch.load(run / "last.pt", map_location="cpu", weights_only=True)
    name = next(k for k, v in checkpoint[part].items() if v.is_floating_point() and v.numel() > 1)
    checkpoint[part][name].view(-1)[1] = value
    torch.save(checkpoint, path)
    return path, f"{part}.{name}"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def _image(tmp_path: Path) -> Path:
    path = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(path)
    return path


def _commands(task: str, checkpoint: Path, data: dict[str, Path], tmp_path: Path) -> list[list[str]]:
    """Every command of ``task`` that reads the weights of ``checkpoint``."""
    prefix, flags = TRAIN[task]
    train = [*prefix, "train", "--data", str(data[task]), *ONE_STEP, *flags]
    commands = [[*train, "--output", str(tmp_path / "resumed"), "--resume", str(checkpoint), "--epochs", "2",
                 "--max-steps", "2"],
                [*train, "--output", str(tmp_path / "initialised"), "--init", str(checkpoint)]]
    if task == "cls":
        commands += [["eval", "--checkpoint", str(checkpoint), "--data", str(data[task]), *CPU],
                     ["eval", "--checkpoint", str(checkpoint), "--data", str(data[task]), "--ema", *CPU],
                     ["predict", str(_image(tmp_path)), "--checkpoint", str(checkpoint)],
                     ["export", "--checkpoint", str(checkpoint), "--format", "hf", "--out", str(tmp_path / "hf")],
                     ["export", "--checkpoint", str(checkpoint), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]]
    elif task == "gen":
        commands.append(["gen", "sample", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "samples"),
                         "--num-per-class", "1", "--steps", "2", "--device", "cpu"])
    else:
        commands.append([task, "eval", "--checkpoint", str(checkpoint), "--data", str(data[task]), *CPU])
    return commands


@pytest.mark.parametrize("task", list(TRAIN))
@pytest.mark.parametrize("part, value, what", [("model", math.nan, "1 NaN"), ("ema", math.inf, "1 Inf")])
def test_weights_that_are_not_finite_are_refused_by_every_reader(task, part, value, what, runs, data, tmp_path,
                                                                  capsys):
    checkpoint, tensor = corrupt(runs[task], part, value, tmp_path / "bad.pt")
    capsys.readouterr()
    for command in _commands(task, checkpoint, data, tmp_path):
        assert main(command) == 2, command
        line = _one_error_line(capsys)
        assert f"{checkpoint} holds weights that are not finite: {tensor} has {what} of its" in line, (command, line)
    assert {p.name for p in tmp_path.rglob("*") if p.is_file()} <= {"bad.pt", "image.png"}  # no run, export, samples


@pytest.fixture
def broken_outputs(monkeypatch):
    """``broken_outputs(value)``: models loaded for a command give ``value`` wherever they would give a float."""
    def broken(value: float):
        def replace(output):
            if isinstance(output, torch.Tensor):
                return torch.full_like(output, value) if output.is_floating_point() else output
            if isinstance(output, dict):
                return {k: replace(v) for k, v in output.items()}
            return type(output)(replace(v) for v in output) if isinstance(output, (list, tuple)) else output

        def load_then_break(model, *args, **kwargs):
            kept = load_weights(model, *args, **kwargs)
            model.register_forward_hook(lambda module, inputs, output: replace(output))
            return kept

        monkeypatch.setattr(weights_module, "load_weights", load_then_break)

    load_weights = weights_module.load_weights
    return broken


@pytest.mark.parametrize("task", list(TRAIN))
def test_non_finite_outputs_of_finite_weights_are_an_error_not_a_score(task, runs, data, tmp_path, capsys,
                                                                      broken_outputs):
    checkpoint = runs[task] / "last.pt"
    broken_outputs(math.inf)  # the sampler's clamp of x0 may not hide an infinite prediction
    if task == "cls":
        commands = [["eval", "--checkpoint", str(checkpoint), "--data", str(data[task]), *CPU,
                     "--json", str(tmp_path / "r.json")],
                    ["predict", str(_image(tmp_path)), "--checkpoint", str(checkpoint), "--out", str(tmp_path / "p.json")],
                    ["export", "--checkpoint", str(checkpoint), "--format", "onnx", "--out", str(tmp_path / "m.onnx")]]
        expected = "non-finite logits"
    elif task == "gen":
        commands = [["gen", "sample", "--checkpoint", str(checkpoint), "--out", str(tmp_path / "samples"),
                     "--num-per-class", "1", "--steps", "2", "--device", "cpu", "--cfg-scale", "1"]]  # calls the model
        expected = "non-finite samples (NaN or Inf) for 2 image(s), the first being image 1 (batch 1)"
    else:
        commands = [[task, "eval", "--checkpoint", str(checkpoint), "--data", str(data[task]), *CPU,
                     "--json", str(tmp_path / "r.json")]]
        if task == "det":
            commands.append(["det", "predict", str(_image(tmp_path)), "--checkpoint", str(checkpoint), "--device", "cpu",
                             "--out", str(tmp_path / "drawn")])
        expected = {"det": "non-finite detections", "seg": "non-finite logits (NaN or Inf) for 2 image(s)"}[task]
    capsys.readouterr()
    for command in commands:
        assert main(command) == 1, command
        captured = capsys.readouterr()
        assert not re.search(r"\b(nan|inf)\b", captured.out, re.IGNORECASE), captured.out
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and expected in err[0] and "is given from them" in err[0], err
    assert not [p for p in tmp_path.rglob("*") if p.name != "image.png" and p.is_file()]  # no results, no samples


def test_every_json_the_project_writes_is_strict(runs, data, tmp_path, capsys):
    assert strict_json(json_text({"a": math.nan, "b": [math.inf, 1.5], "c": (-math.inf,)})) == \
        {"a": None, "b": [None, 1.5], "c": [None]}
    for run in runs.values():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            strict_json(line)
    capsys.readouterr()
    # COCO gives no AP for sizes no object has: absent (null), never NaN
    assert main(["det", "eval", "--checkpoint", str(runs["det"] / "last.pt"), "--data", str(data["det"]), *CPU,
                 "--json", str(tmp_path / "det.json")]) == 0
    assert strict_json(capsys.readouterr().out.strip().splitlines()[-1])
    assert strict_json((tmp_path / "det.json").read_text())
    for command, out in ((["eval", "--checkpoint", str(runs["cls"] / "last.pt"), "--data", str(data["cls"]), *CPU,
                           "--json"], "cls.json"),
                         (["predict", str(_image(tmp_path)), "--checkpoint", str(runs["cls"] / "last.pt"), "--out"],
                          "predict.json"),
                         (["seg", "eval", "--checkpoint", str(runs["seg"] / "last.pt"), "--data", str(data["seg"]),
                           *CPU, "--json"], "seg.json")):
        assert main([*command, str(tmp_path / out)]) == 0, command
        strict_json((tmp_path / out).read_text())
