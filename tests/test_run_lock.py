"""A run folder belongs to one process: a second train, --resume auto or --overwrite on a running folder is
refused in one line naming the process; a killed run's folder resumes; two new runs at once: exactly one runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import weightformer.engine.loop as loop
from conftest_train import make_image_folder
from weightformer.cli import main
from weightformer.engine.metrics import read_metrics
from weightformer.engine.run_dir import LOCK_FILE

FLAGS = ["--img-size", "16", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "1",
         "--model-kwargs", "patch_size=4", "embed_dim=16", "depth=1"]
HOLD = ("import sys; from pathlib import Path; from weightformer.engine.run_dir import hold_run_folder\n"
        "with hold_run_folder(Path(sys.argv[1])):\n    print('held', flush=True); sys.stdin.read()")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=("a", "b"), train_per_class=4, val_per_class=2)


def _train(folder: Path, output: Path, *extra: str) -> int:
    return main(["train", "--data", str(folder), "--output", str(output), *FLAGS, *extra])


def test_while_a_run_goes_on_a_second_run_resume_or_overwrite_on_its_folder_is_refused(folder, tmp_path, capsys,
                                                                                        monkeypatch):
    output = tmp_path / "run"
    assert _train(folder, output, "--epochs", "1") == 0
    end_epoch, second = loop.end_epoch, {}

    def end_epoch_then_others(*args, **kwargs):  # while run A holds the folder, between two of its epochs
        end_epoch(*args, **kwargs)
        if not second:
            for name, extra in (("resume", ["--resume", "auto"]), ("overwrite", ["--overwrite"]), ("new", [])):
                second[name] = (_train(folder, output, "--epochs", "3", *extra), capsys.readouterr().err)

    monkeypatch.setattr(loop, "end_epoch", end_epoch_then_others)
    assert _train(folder, output, "--epochs", "3", "--resume", "auto") == 0
    for name, (code, err) in second.items():
        assert code == 2 and err.count("\n") == 1, (name, err)
        assert f"{output} is in use by process {os.getpid()} (" in err and "choose another --output" in err, err
    records = read_metrics(output / "metrics.jsonl")
    assert [r["step"] for r in records] == [2, 4, 6]  # each step once: no second run wrote into the folder
    best = torch.load(output / "best.pt", map_location="cpu", weights_only=True)
    assert best["val_top1"] == max(r["val_top1"] for r in records)
    assert not (output / LOCK_FILE).exists() and not list(output.glob("previous-*"))


def test_a_killed_runs_folder_is_free_and_resumes(folder, tmp_path, capsys):
    output = tmp_path / "run"
    assert _train(folder, output, "--epochs", "1") == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(output)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        capsys.readouterr()
        assert _train(folder, output, "--epochs", "2", "--resume", "auto") == 2
        assert f"is in use by process {holder.pid} (" in capsys.readouterr().err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (output / LOCK_FILE).exists()  # the killed holder's lock file, no longer locked
    assert _train(folder, output, "--epochs", "2", "--resume", "auto") == 0
    assert "resumed from" in capsys.readouterr().out
    assert [r["epoch"] for r in read_metrics(output / "metrics.jsonl")] == [1, 2]


def test_a_checkpoint_saved_while_a_run_starts_is_read_again_or_refused(folder, tmp_path, capsys, monkeypatch):
    output = tmp_path / "run"
    assert _train(folder, output, "--epochs", "1") == 0
    shutil.copyfile(output / "last.pt", tmp_path / "epoch1.pt")
    assert _train(folder, output, "--epochs", "2", "--resume", "auto") == 0
    shutil.copyfile(output / "last.pt", tmp_path / "epoch2.pt")
    shutil.copyfile(tmp_path / "epoch1.pt", output / "last.pt")
    hold, saved = loop.hold_run_folder, {}

    def saved_by_another_run_first(folder_held):  # what a run that held the folder until now saved last
        folder_held.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(saved["file"], folder_held / "last.pt")
        return hold(folder_held)

    monkeypatch.setattr(loop, "hold_run_folder", saved_by_another_run_first)
    saved["file"] = tmp_path / "epoch2.pt"
    capsys.readouterr()
    assert _train(folder, output, "--epochs", "3", "--resume", "auto") == 0
    assert "at epoch 3, step 0" in capsys.readouterr().out  # from epoch 2's checkpoint, not the one read before
    assert [r["epoch"] for r in read_metrics(output / "metrics.jsonl")] == [1, 2, 3]

    saved["file"] = tmp_path / "epoch1.pt"
    assert _train(folder, tmp_path / "new", "--epochs", "1", "--resume", "auto") == 2
    assert "another process saved" in capsys.readouterr().err


def test_two_new_runs_at_once_into_one_output_exactly_one_runs(folder, tmp_path):
    output = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(Path(loop.__file__).parents[2]),
                                                                    os.environ.get("PYTHONPATH")) if p)}
    command = [sys.executable, "-m", "weightformer", "train", "--data", str(folder), "--output", str(output), *FLAGS,
               "--epochs", "1"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    results = sorted((run.communicate()[1], run.returncode)[::-1] for run in runs)
    assert [code for code, _ in results] == [0, 2], results
    refusal = results[1][1].strip()
    assert "is in use by process" in refusal or "already holds a run" in refusal, refusal
    assert len(read_metrics(output / "metrics.jsonl")) == 1
