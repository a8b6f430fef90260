"""One policy for every command that writes, one parser for every setting and flag: nothing is lost, no
traceback for a user's mistake, no nonsense accepted."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from weightformer.cli import main
from weightformer.engine import prepare_config

pytestmark = pytest.mark.usefixtures("one_thread")

LEGACY = Path(__file__).resolve().parent / "data" / "legacy_checkpoints"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A copy of a classification run folder (best.pt, last.pt)."""
    folder = tmp_path / "run"
    shutil.copytree(LEGACY / "cls", folder)
    return folder


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "pictures" / "a.png"
    path.parent.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)).save(path)
    return path


# -------------------------------------------------------------------------------------------------
# Settings written as users write them
# -------------------------------------------------------------------------------------------------
def test_e_notation_is_a_number_in_flags_files_and_model_kwargs(tmp_path: Path):
    config = tmp_path / "run.yaml"
    config.write_text("lr: 1e-3\nmin_lr: 2E-6\nwarmup_lr: 1.0e-7\n")
    cfg = prepare_config({"weight_decay": 1e-2, "model_kwargs": {"drop_path_rate": 1e-1}}, str(config),
                         task="classification").cfg
    assert (cfg.lr, cfg.min_lr, cfg.warmup_lr) == (1e-3, 2e-6, 1e-7)
    from weightformer.engine.config import parse_model_kwargs

    assert parse_model_kwargs(["lr=1e-3", "drop_path_rate=5e-2", "depth=4", "name=1e"], flag="--set") == {
        "lr": 1e-3, "drop_path_rate": 5e-2, "depth": 4, "name": "1e"}


@pytest.mark.parametrize("argv, message", [
    (["gen", "sample", "--checkpoint", str(LEGACY / "gen" / "best.pt"), "--out", "OUT", "--cfg-scale", "nan"],
     "--cfg-scale: must be a finite number"),
    (["gen", "sample", "--checkpoint", str(LEGACY / "gen" / "best.pt"), "--out", "OUT", "--cfg-scale", "inf"],
     "--cfg-scale: must be a finite number"),
    (["det", "predict", "IMAGE", "--checkpoint", str(LEGACY / "det" / "best.pt"), "--out", "OUT",
      "--score-threshold", "nan"], "--score-threshold: must be a finite number"),
    (["seg", "predict", "IMAGE", "--checkpoint", str(LEGACY / "seg" / "best.pt"), "--out", "OUT", "--alpha", "nan"],
     "--alpha: must be a finite number"),
    (["det", "train", "--lr", "nan"], "--lr: must be a finite number"),
    (["seg", "eval", "--checkpoint", "x.pt", "--inference", "sideways"], "invalid choice: 'sideways'"),
])
def test_a_bad_flag_is_one_line_naming_the_command(argv, message, image: Path, tmp_path: Path, capsys):
    argv = [str(image) if a == "IMAGE" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert message in line and "--help" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", [
    ["export", "--format", "onnx", "--out", "OUT/m.onnx", "--checkpoint"],
    ["det", "eval", "--checkpoint"],
    ["gen", "sample", "--out", "OUT", "--checkpoint"],
    ["eval", "--checkpoint"],
])
def test_a_text_file_named_pt_is_one_line(command, tmp_path: Path, capsys):
    text = tmp_path / "notes.pt"
    text.write_text("these are my notes, not weights\n")
    argv = [str(tmp_path / a[4:]) if a.startswith("OUT/") else str(tmp_path / "out") if a == "OUT" else a
            for a in command]
    assert main([*argv, str(text)]) == 2
    assert "is not a readable PyTorch checkpoint" in _one_error_line(capsys)


# -------------------------------------------------------------------------------------------------
# Nothing lost
# -------------------------------------------------------------------------------------------------
def test_json_never_replaces_a_file_unasked_nor_an_input(run: Path, tmp_path: Path, capsys):
    last = (run / "last.pt").read_bytes()
    evaluate = ["eval", "--checkpoint", str(run / "best.pt"), "--workers", "0", "--batch-size", "500"]
    # the command's own input: refused even with --overwrite
    assert main([*evaluate, "--json", str(run / "best.pt"), "--overwrite"]) == 2
    assert "is the command's --checkpoint input" in _one_error_line(capsys)
    # an existing file: refused, and kept, unless --overwrite, which moves it aside
    assert main([*evaluate, "--json", str(run / "last.pt")]) == 2
    assert "already exists; pass --overwrite" in _one_error_line(capsys)
    assert (run / "last.pt").read_bytes() == last
    assert main(["det", "eval", "--checkpoint", str(LEGACY / "det" / "best.pt"), "--workers", "0",
                 "--json", str(run / "last.pt")]) == 2
    assert "already exists" in _one_error_line(capsys)
    assert main([*evaluate, "--json", str(run / "last.pt"), "--overwrite"]) == 0
    aside = list(run.glob("last.pt.previous-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == last
    assert '"top1"' in (run / "last.pt").read_text()


def test_export_overwrite_moves_the_old_output_aside_and_never_writes_into_its_input(run: Path, tmp_path: Path,
                                                                                     capsys):
    export = ["export", "--checkpoint", str(run / "best.pt"), "--format", "hf"]
    assert main([*export, "--out", str(run), "--overwrite"]) == 2  # the run folder the checkpoint is in
    assert "would write over the command's input" in _one_error_line(capsys)
    assert sorted(p.name for p in run.iterdir()) == ["best.pt", "last.pt"]
    hub = tmp_path / "hub"
    assert main([*export, "--out", str(hub)]) == 0
    (hub / "mine.txt").write_text("keep me")
    assert main([*export, "--out", str(hub)]) == 2
    assert main([*export, "--out", str(hub), "--overwrite"]) == 0
    (aside,) = tmp_path.glob("hub.previous-*")
    assert (aside / "mine.txt").read_text() == "keep me" and (hub / "model.safetensors").is_file()


@pytest.mark.parametrize("task", ["det", "seg"])
def test_predict_into_an_earlier_predicts_folder_is_refused_unless_overwrite(task: str, image: Path,
                                                                             tmp_path: Path, capsys):
    out = tmp_path / "predictions"
    command = [task, "predict", str(image), "--checkpoint", str(LEGACY / task / "best.pt"), "--device", "cpu"]
    assert main([*command, "--out", str(out)]) == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main([*command, "--out", str(out)]) == 2
    assert "pass --overwrite" in _one_error_line(capsys)
    assert main([*command, "--out", str(out), "--overwrite"]) == 0
    for name, content in first.items():  # the earlier files, moved aside
        (aside,) = out.glob(f"{name}.previous-*")
        assert aside.read_bytes() == content
    # predictions written into the images' own folder never replace an image (seg names them after it)
    if task == "seg":
        assert main([*command, "--out", str(image.parent), "--overwrite"]) == 2
        assert "would write over the command's input" in _one_error_line(capsys)
        assert Image.open(image).size == (80, 60)


def test_gen_sample_keeps_earlier_samples_unless_overwrite(tmp_path: Path, capsys):
    out = tmp_path / "samples"
    sample = ["gen", "sample", "--checkpoint", str(LEGACY / "gen" / "best.pt"), "--out", str(out), "--steps", "2",
              "--num-per-class", "1", "--classes", "1", "--device", "cpu"]
    assert main(sample) == 0
    before = (out / "samples.npz").read_bytes()
    capsys.readouterr()
    assert main(sample) == 2
    assert "--overwrite" in _one_error_line(capsys)
    assert (out / "samples.npz").read_bytes() == before


# -------------------------------------------------------------------------------------------------
# Accepted, then silently wrong
# -------------------------------------------------------------------------------------------------
def test_gen_train_refuses_an_image_size_it_would_not_train_at(tmp_path: Path, capsys):
    assert main(["gen", "train", "--img-size", "7", "--max-steps", "1", "--output", str(tmp_path / "g")]) == 2
    assert "--img-size 7 is smaller than mnist's 28 px images" in _one_error_line(capsys)
    assert not (tmp_path / "g").exists()


@pytest.mark.parametrize("content, message", [
    (b"hello", "not a NumPy .npz archive"),
    ("floats", "its images are float64"),
    ("object", "not a NumPy .npz archive"),
])
def test_gen_eval_refuses_what_is_not_a_samples_file(content, message, tmp_path: Path, capsys):
    path = tmp_path / "samples.npz"
    if content == "floats":
        np.savez(path, images=np.random.rand(4, 28, 28, 1), labels=np.arange(4))
    elif content == "object":
        np.savez(path, images=np.array([{"a": 1}], dtype=object), labels=np.arange(1))
    else:
        path.write_bytes(content)
    assert main(["gen", "eval", str(path)]) == 2
    line = _one_error_line(capsys)
    assert message in line and "allow_pickle" not in line


def test_a_run_that_never_started_leaves_no_empty_folder(tmp_path: Path, capsys):
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "val").mkdir()
    for command in (["train"], ["det", "train"], ["seg", "train"]):
        output = tmp_path / f"run_{len(command)}_{command[0]}"
        assert main([*command, "--data", str(data), "--output", str(output)]) == 2
        _one_error_line(capsys)
        assert not output.exists()


def test_a_signal_stops_an_ablation_with_its_own_exit_code(tmp_path: Path, monkeypatch, capsys):
    from weightformer.analysis import ablate

    grid = tmp_path / "grid.yaml"
    grid.write_text(f"name: g\noutput: {tmp_path / 'out'}\nseeds: [0]\nrecipe: {{epochs: 1}}\n"
                    "variants:\n  a: {}\n")

    class Stopped:
        stopped_by = "SIGTERM"

    monkeypatch.setattr("weightformer.engine.train", lambda *args, **kwargs: Stopped())
    assert ablate.main([str(grid)]) == 143
    assert "stopped by SIGTERM" in capsys.readouterr().err


def test_det_eval_checks_its_visualize_folder_before_the_evaluation(tmp_path: Path, capsys, monkeypatch):
    from weightformer.detection import evaluation

    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated before checking --out"))
    assert main(["det", "eval", "--checkpoint", str(LEGACY / "det" / "best.pt"), "--workers", "0",
                 "--visualize", "2", "--out", str(blocker / "vis")]) == 2
    assert "--out" in _one_error_line(capsys)


@pytest.mark.parametrize("task", ["cls", "det", "seg", "gen"])
def test_init_help_promises_nothing_a_task_refuses(task: str, capsys):
    with pytest.raises(SystemExit):
        main([task, "train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--init PATH" in text and "starts fresh" not in text


def test_analyze_erf_overwrite_moves_the_earlier_files_aside(tmp_path: Path):
    png = tmp_path / "erf.png"
    args = ["analyze", "erf", "--model", "weightformer_tiny:embed_dim=16,depth=2,patch_size=4", "--img-size", "16",
            "--num-images", "1", "--output", str(png)]
    assert main(args) == 0
    first = png.read_bytes()
    assert main([*args, "--overwrite"]) == 0
    (aside,) = tmp_path.glob("erf.png.previous-*")
    assert aside.read_bytes() == first and len(list(tmp_path.glob("erf.json.previous-*"))) == 1
