"""A fifth task defined in one module outside the package (tests/fifth_task.py, docs/tasks.md) gets
train, eval, predict, exact resume, torchrun and the one weights reader from the engine, with no
edit under src/."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest_train import assert_same_weights, make_image_folder, tiny_config, weights
from fifth_task import BlobNet, BlobsTask, evaluate_checkpoint, generate_blobs, main, predict
from weightformer.cli import main as weightformer_main
from weightformer.engine import load_model, train
from weightformer.engine.metrics import read_metrics

TESTS = Path(__file__).resolve().parent
# 96 generated images in batches of 16: 6 steps an epoch, 2 epochs; a narrow model; bit-exact on CPU.
SMALL = ["--device", "cpu", "--workers", "0", "--synthetic-images", "96", "--batch-size", "16", "--epochs", "2",
         "--model-kwargs", "width=8", "--deterministic", "--log-interval", "1000"]


def _save_images(folder: Path, images: np.ndarray, counts: np.ndarray, by_count: bool = False) -> list[Path]:
    """PNG files of (N, H, W) uint8 images, in <count>/ subfolders with ``by_count``."""
    files = []
    for i, (image, count) in enumerate(zip(images, counts)):
        path = folder / (str(count) if by_count else "") / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).convert("RGB" if i % 2 else "L").save(path)  # both modes are read as gray
        files.append(path)
    return files


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The offline recipe, shortened: 400 generated images, 3 epochs of 25 steps. (output, stdout)"""
    output = tmp_path_factory.mktemp("trained")
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # a module-scoped fixture cannot use capsys
        code = main(["train", "--output", str(output), "--device", "cpu", "--synthetic-images", "400",
                     "--batch-size", "16", "--epochs", "3", "--warmup-epochs", "0.25", "--log-interval", "1000"])
    assert code == 0
    return output, log.getvalue()


def test_train_cli_learns_and_eval_cli_reports_it(trained, tmp_path: Path, capsys):
    output, log = trained
    assert log.splitlines()[0].startswith("recipe offline: generated 32 px blobs")
    assert f"evaluate with: {BlobsTask.cli.program} eval --checkpoint {output / 'best.pt'}" in log
    result_file = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint", str(output / "best.pt"), "--device", "cpu", "--json", str(result_file)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    result = json.loads(result_file.read_text())
    assert printed == result
    assert result["images"] == 100 and result["data"] == "blobs"
    assert result["mae"] < 0.75  # predicting the mean count (2.5) scores 1.5
    # The command is a layer over the library function, which gives the same numbers.
    assert evaluate_checkpoint(output / "best.pt") == {**result, "checkpoint": str(output / "best.pt")}
    # best.pt holds the best validation MAE of the run (lower is better).
    maes = [r["val_mae"] for r in read_metrics(output / "metrics.jsonl")]
    assert result["mae"] == pytest.approx(min(maes), rel=1e-6)


def test_predict_cli_counts_image_files(trained, tmp_path: Path, capsys):
    output, _ = trained
    images, counts = generate_blobs(16, seed=7)
    files = _save_images(tmp_path / "images", images, counts)
    assert main(["predict", str(tmp_path / "images"), "--checkpoint", str(output / "best.pt"), "--device", "cpu"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["predictions"]
    assert [row["path"] for row in rows] == sorted(str(f) for f in files)
    truth = {str(f): int(c) for f, c in zip(files, counts)}
    assert np.mean([abs(row["blobs"] - truth[row["path"]]) for row in rows]) < 0.75
    library = predict(output / "best.pt", [str(f) for f in files])
    assert {row["path"]: row["count"] for row in rows} == {p.path: p.count for p in library}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("uninterrupted")
    assert main(["train", "--output", str(output), *SMALL]) == 0
    return output


@pytest.mark.parametrize("stop_at", [4, 6])  # mid-epoch, and at the epoch boundary
def test_max_steps_then_resume_auto_matches_uninterrupted(uninterrupted: Path, tmp_path: Path, stop_at: int):
    assert main(["train", "--output", str(tmp_path), *SMALL, "--max-steps", str(stop_at)]) == 0
    assert torch.load(tmp_path / "last.pt", weights_only=True)["global_step"] == stop_at
    # --resume auto alone: the run's own saved settings apply (minus max_steps).
    assert main(["train", "--output", str(tmp_path), "--resume", "auto"]) == 0
    assert_same_weights(weights(tmp_path / "last.pt"), weights(uninterrupted / "last.pt"))
    a = torch.load(tmp_path / "last.pt", weights_only=True)["optimizer"]["state"]
    b = torch.load(uninterrupted / "last.pt", weights_only=True)["optimizer"]["state"]
    assert all(torch.equal(a[i]["exp_avg_sq"], b[i]["exp_avg_sq"]) for i in b)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "img_per_s"} for r in rs]  # noqa: E731
    assert strip(read_metrics(tmp_path / "metrics.jsonl")) == strip(read_metrics(uninterrupted / "metrics.jsonl"))


# torchrun runs the module's own command line; the task's after_training hook (called on every rank)
# is replaced here to record each rank's final weights.
TORCHRUN_SCRIPT = """
import dataclasses, hashlib, os, sys
import fifth_task

def record_weights(result, args):
    digest = hashlib.sha256()
    for name, tensor in sorted(result.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.txt"), "w") as f:
        f.write(digest.hexdigest())

fifth_task.BlobsTask.cli = dataclasses.replace(fifth_task.BlobsTask.cli, after_training=record_weights)
sys.exit(fifth_task.main(sys.argv[2:]))
"""


def test_torchrun_two_cpu_processes_keep_identical_weights(tmp_path: Path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    output = tmp_path / "out"
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(tmp_path), "train", "--output", str(output), *SMALL, "--max-steps", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    hashes = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert hashes[0] == hashes[1]
    record = read_metrics(output / "metrics.jsonl")[-1]
    assert record["world_size"] == 2 and record["step"] == 4  # 96 images over 2 ranks: 3 steps an epoch
    assert proc.stdout.count("writing to") == 1  # only rank 0 prints


def test_help_speaks_of_the_task(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # help wraps lines
    assert out.startswith(f"usage: {BlobsTask.cli.program}") and "Count the bright blobs" in out
    assert "{train,eval,predict}" in out
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Train a blobs model" in out and "offline: generated 32 px blobs" in out and "small-data:" in out
    assert "--max-blobs" in out and "--synthetic-images" in out and "blobnet" in out
    assert "imagenet" not in out.lower()
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert f"a last.pt or best.pt written by {BlobsTask.cli.program} train" in " ".join(capsys.readouterr().out.split())


@pytest.fixture(scope="module")
def classifier_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = make_image_folder(tmp_path_factory.mktemp("cls_data"), train_per_class=4, val_per_class=2)
    output = tmp_path_factory.mktemp("cls_run")
    train(tiny_config(data, output, epochs=1, max_steps=1), task="classification")
    return output / "last.pt"


def test_a_classification_checkpoint_is_refused_with_the_one_message(classifier_checkpoint: Path, tmp_path: Path,
                                                                     capsys):
    image = _save_images(tmp_path, *generate_blobs(1))[0]
    for command in (["eval", "--checkpoint", str(classifier_checkpoint), "--device", "cpu"],
                    ["predict", str(image), "--checkpoint", str(classifier_checkpoint), "--device", "cpu"]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"error: {classifier_checkpoint} is a classification checkpoint, not a blobs one; use it with "
                       f"weightformer (e.g. weightformer eval --checkpoint {classifier_checkpoint})")


def test_a_blobs_checkpoint_loads_through_the_engine_and_is_refused_by_other_tasks(uninterrupted: Path, capsys):
    best = uninterrupted / "best.pt"
    for task in (BlobsTask, "blobs", None):  # None: the task the checkpoint names, found in the registry
        loaded = load_model(best, task=task)
        assert loaded.task is BlobsTask and isinstance(loaded.model, BlobNet) and not loaded.model.training
        assert loaded.meta["model_kwargs"] == {"width": 8, "depth": 3} and loaded.meta["img_size"] == 32
    images = torch.from_numpy(generate_blobs(2, seed=3)[0]).float().div(255).unsqueeze(1)  # (2, 1, 32, 32)
    expected = BlobNet(width=8, depth=3)
    expected.load_state_dict(weights(best))
    assert torch.equal(loaded.model(images), expected.eval()(images))
    # The built-in classifier's eval names this task's command line.
    assert weightformer_main(["eval", "--checkpoint", str(best), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert f"is a blobs checkpoint, not a classification one; use it with {BlobsTask.cli.program}" in err


def test_config_section_and_recipe_for_a_folder(tmp_path: Path, capsys):
    assert main(["train", "--output", str(tmp_path / "bad"), "--max-blobs", "0", "--device", "cpu"]) == 2
    assert capsys.readouterr().err.strip() == "error: max_blobs must be from 1 to 12 (more do not fit apart in an " \
                                              "image), got 0"
    folder = tmp_path / "counted"
    for split, seed in (("train", 0), ("val", 1)):
        _save_images(folder / split, *generate_blobs(12, size=40, max_blobs=3, seed=seed), by_count=True)
    run = ["train", "--data", str(folder), "--output", str(tmp_path / "run"), "--device", "cpu", "--workers", "0",
           "--batch-size", "4", "--max-steps", "2"]
    assert main(run) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("recipe small-data:") and f"{folder / 'train'} holds 12 images" in first
    assert evaluate_checkpoint(tmp_path / "run" / "last.pt")["images"] == 12  # its own folder's val/, at 32 px
    _save_images(folder / "val" / "many", *generate_blobs(1))
    assert main([*run[:4], str(tmp_path / "run2"), *run[5:]]) == 2
    assert "is not named by a count" in capsys.readouterr().err


def test_no_file_under_src_names_the_fifth_task():
    src = TESTS.parent / "src"
    named = [p for p in src.rglob("*.py") if any(w in p.read_text() for w in ("fifth_task", "BlobsTask", "blobnet"))]
    assert not named


def test_the_code_blocks_of_docs_tasks_md_are_excerpts_of_the_module():
    """docs/tasks.md quotes the module: each ``# tests/fifth_task.py`` block, cut at its ``...`` lines,
    is a run of the module's lines as they are."""
    source = (TESTS / "fifth_task.py").read_text()
    blocks = re.findall(r"```python\n# tests/fifth_task.py\n(.*?)```", (TESTS.parent / "docs" / "tasks.md").read_text(),
                        flags=re.S)
    assert len(blocks) >= 6
    for block in blocks:
        for excerpt in re.split(r"^\s*\.\.\.\n", block, flags=re.M):
            assert excerpt.strip() and excerpt in source, f"docs/tasks.md quotes code the module lacks:\n{excerpt}"
