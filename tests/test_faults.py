"""Faults of the machine under a command: a full disk (a small tmpfs, where this test may mount one), a file-size
limit (``RLIMIT_FSIZE``, SIGXFSZ ignored: writes get EFBIG), a name too long, memory that a setting cannot have,
and SIGKILL in the middle of a write. Each is one line and exit 1, the old files byte for byte, no temporary
file left; and no command writes its output onto one of its inputs."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import matplotlib.pyplot  # noqa: F401  (imported, with its font cache, before any limit)
import numpy as np
import pytest
from PIL import Image

from conftest_train import make_image_folder
from weightformer.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

LEGACY = Path(__file__).resolve().parent / "data" / "legacy_checkpoints"
TRAIN = ["--model", "weightformer_tiny", "--model-kwargs", "patch_size=4", "embed_dim=32", "depth=2",
         "--img-size", "16", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--warmup-epochs", "0"]
LIMIT = 4096  # bytes a file: more than a config.yaml, a metrics line or a JSON result; less than any model


def _one_error_line(capsys) -> str:
    """The one ``error:`` line of what the command printed (no traceback)."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden temporaries included) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """This process's writes capped at ``nbytes`` a file, as ``ulimit -f`` does (EFBIG, SIGXFSZ ignored)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, where this test may mount one (root, a mount command); skipped elsewhere."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> None:
    """Fill ``disk`` to its last byte."""
    with open(disk / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny ImageFolder and a one-epoch classification run on it (best.pt, last.pt)."""
    root = tmp_path_factory.mktemp("trained")
    data = make_image_folder(root / "data", size=16, train_per_class=4, val_per_class=2)
    assert main(["train", "--data", str(data), "--output", str(root / "run"), "--epochs", "1", *TRAIN]) == 0
    return data, root / "run"


@pytest.fixture
def run(trained, tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(trained[1], folder)
    return folder


# -------------------------------------------------------------------------------------------------
# A full disk and a file-size limit: one line, exit 1, the old files byte for byte, no temporary left
# -------------------------------------------------------------------------------------------------
def _preexec_file_size_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def test_train_under_a_file_size_limit_keeps_the_old_checkpoints(trained, run: Path):
    before = _files(run)
    command = [sys.executable, "-m", "weightformer", "train", "--data", str(trained[0]), "--output", str(run),
               "--resume", "auto", "--epochs", "2", *TRAIN]
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=_preexec_file_size_limit, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert done.returncode == 1 and len(errors) == 1, done.stderr
    assert "file too large" in errors[0] and ".pt" in errors[0] and f"{LIMIT} bytes" in errors[0]
    after = _files(run)
    for name in ("best.pt", "last.pt"):
        assert after[name] == before[name]
    assert not [name for name in after if name.endswith(".tmp")]


def test_the_first_save_of_a_new_run_on_a_full_disk_is_one_line(trained, small_disk: Path, capsys):
    _fill(small_disk)
    output = small_disk / "run"
    assert main(["train", "--data", str(trained[0]), "--output", str(output), "--epochs", "1", *TRAIN]) == 1
    line = _one_error_line(capsys)
    assert "no space left" in line and "bytes free" in line
    assert not [p for p in small_disk.rglob("*") if p.name.endswith(".tmp")]


def test_eval_json_on_a_full_disk_is_exit_1_and_keeps_the_old_file(trained, run: Path, small_disk: Path, capsys):
    old = small_disk / "results.json"
    old.write_text('{"mine": 1}\n')
    _fill(small_disk)
    assert main(["eval", "--checkpoint", str(run / "best.pt"), "--data", str(trained[0]), "--workers", "0",
                 "--json", str(old), "--overwrite"]) == 1
    line = _one_error_line(capsys)
    assert "results.json" in line and "no space left" in line
    assert old.read_text() == '{"mine": 1}\n' and sorted(p.name for p in small_disk.iterdir()) == ["filler",
                                                                                                 "results.json"]


def test_eval_json_under_a_file_size_limit_is_exit_1(trained, run: Path, tmp_path: Path, capsys):
    out = tmp_path / "r.json"
    with file_size_limit(200):
        code = main(["eval", "--checkpoint", str(run / "best.pt"), "--data", str(trained[0]), "--workers", "0",
                     "--json", str(out)])
    assert code == 1
    assert "file too large" in _one_error_line(capsys)
    assert list(tmp_path.iterdir()) == [tmp_path / "run"]  # nothing written, nothing left


@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_export_under_a_file_size_limit_keeps_the_old_export(fmt: str, run: Path, tmp_path: Path, capsys,
                                                              monkeypatch):
    out = tmp_path / ("hub" if fmt == "hf" else "model.onnx")
    export = ["export", "--checkpoint", str(run / "best.pt"), "--format", fmt, "--out", str(out)]
    if fmt == "onnx":  # an exporter that writes as torch.onnx.export does, in a fraction of its time
        export.append("--no-check")
        monkeypatch.setattr("torch.onnx.export", lambda model, args, path, **kwargs: Path(path).write_bytes(
            b"\0" * 2 * LIMIT))
    assert main(export) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} | (
        _files(out) if out.is_dir() else {})
    capsys.readouterr()
    with file_size_limit(LIMIT):
        code = main([*export, "--overwrite"])
    assert code == 1
    line = _one_error_line(capsys)
    assert "file too large" in line and str(out) in line
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} | (_files(out) if out.is_dir() else {})
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run", out.name])  # nothing aside, no temporary


def test_predict_and_gen_sample_under_a_file_size_limit(trained, run: Path, tmp_path: Path, capsys):
    image = next((trained[0] / "val").rglob("*.png"))
    out = tmp_path / "p.csv"
    with file_size_limit(64):
        code = main(["predict", str(image), "--checkpoint", str(run / "best.pt"), "--out", str(out)])
    assert code == 1 and "file too large" in _one_error_line(capsys) and not out.exists()
    samples = tmp_path / "samples"
    samples.mkdir()
    (samples / "samples.tmp.npz").write_bytes(b"the user's own")
    with file_size_limit(256):  # less than one 28 px sample in an npz
        code = main(["gen", "sample", "--checkpoint", str(LEGACY / "gen" / "best.pt"), "--out", str(samples),
                     "--steps", "2", "--num-per-class", "1", "--classes", "1", "--device", "cpu"])
    assert code == 1 and "file too large" in _one_error_line(capsys)
    assert _files(samples) == {"samples.tmp.npz": b"the user's own"}


def test_analyze_under_a_file_size_limit(tmp_path: Path, capsys):
    png = tmp_path / "erf.png"
    with file_size_limit(LIMIT):
        code = main(["analyze", "erf", "--model", "weightformer_tiny:embed_dim=16,depth=2,patch_size=4",
                     "--img-size", "16", "--num-images", "1", "--output", str(png)])
    assert code == 1
    line = _one_error_line(capsys)
    assert "erf.png" in line and "file too large" in line
    assert list(tmp_path.iterdir()) == []


def test_sigkill_in_the_middle_of_a_write_leaves_the_old_file(tmp_path: Path):
    path = tmp_path / "last.pt"
    path.write_bytes(b"the previous checkpoint")
    writer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from weightformer.atomic import write_atomic\n"
        "def slow(f):\n"
        "    f.write(b'x' * 100000); f.flush(); print('writing', flush=True); time.sleep(60)\n"
        f"write_atomic({str(path)!r}, slow)\n")], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    writer.stdout.close()
    assert path.read_bytes() == b"the previous checkpoint"


# -------------------------------------------------------------------------------------------------
# Names too long, memory that a setting cannot have
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["train", "--data", "mnist", "--max-steps", "1", "--output"],
                                     ["analyze", "erf", "--model", "weightformer_tiny", "--output"]])
def test_a_name_too_long_is_one_line(command, tmp_path: Path, capsys):
    assert main([*command, str(tmp_path / ("a" * 300))]) == 1
    line = _one_error_line(capsys)
    assert "file name too long" in line and "300 characters" in line


def test_an_image_side_that_cannot_fit_is_refused_before_the_work(tmp_path: Path, capsys, monkeypatch):
    import weightformer.engine.loop as loop

    monkeypatch.setattr(loop, "build_data", lambda *a, **k: pytest.fail("the data was built"))
    assert main(["train", "--data", "mnist", "--img-size", "100000", "--output", str(tmp_path / "o")]) == 1
    line = _one_error_line(capsys)
    assert "--img-size 100000" in line and "GiB" in line and "available" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:121] "
                                                               "DefaultCPUAllocator: can't allocate memory")])
def test_out_of_memory_from_any_allocator_is_one_line(error, trained, run: Path, capsys, monkeypatch):
    from weightformer.classification import predict as predict_module

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(predict_module, "predict", fail)
    image = next((trained[0] / "val").rglob("*.png"))
    assert main(["predict", str(image), "--checkpoint", str(run / "best.pt")]) == 1
    assert "out of memory" in _one_error_line(capsys)


# -------------------------------------------------------------------------------------------------
# Outputs never onto inputs; a dangling symbolic link is an existing path
# -------------------------------------------------------------------------------------------------
def test_analyze_never_writes_onto_its_input_checkpoint(run: Path, capsys):
    before = _files(run)
    assert main(["analyze", "transfer", "--model", f"ckpt={run / 'best.pt'}", "--output", str(run / "best.pt"),
                 "--overwrite"]) == 2
    assert "would write over the command's input" in _one_error_line(capsys)
    assert main(["analyze", "erf", "--model", f"ckpt={run / 'last.pt'}", "--img-size", "16", "--num-images", "1",
                 "--output", str(run / "erf.png"), "--json", str(run / "last.pt"), "--overwrite"]) == 2
    assert "would write over the command's input" in _one_error_line(capsys)
    assert _files(run) == before


def test_predict_never_writes_onto_its_input_image(run: Path, tmp_path: Path, capsys):
    image = tmp_path / "x.csv"  # a PNG with a .csv name
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(image, format="PNG")
    before = image.read_bytes()
    assert main(["predict", str(image), "--checkpoint", str(run / "best.pt"), "--out", str(image),
                 "--overwrite"]) == 2
    assert "would write over the command's input" in _one_error_line(capsys)
    assert image.read_bytes() == before


def test_det_eval_visualize_keeps_a_users_pictures_unless_overwrite(tmp_path: Path, capsys):
    out = tmp_path / "vis"
    out.mkdir()
    (out / "1.png").write_bytes(b"mine")
    evaluate = ["det", "eval", "--checkpoint", str(LEGACY / "det" / "best.pt"), "--workers", "0",
                "--visualize", "1", "--out", str(out)]
    assert main(evaluate) == 2
    assert "1.png" in _one_error_line(capsys) and (out / "1.png").read_bytes() == b"mine"
    assert main([*evaluate, "--overwrite"]) == 0
    (aside,) = out.glob("1.png.previous-*")
    assert aside.read_bytes() == b"mine" and (out / "1.png").read_bytes()[:4] == b"\x89PNG"


def test_a_dangling_symbolic_link_is_an_existing_path(run: Path, tmp_path: Path, capsys):
    link = tmp_path / "r.json"
    link.symlink_to(tmp_path / "nowhere")
    evaluate = ["eval", "--checkpoint", str(run / "best.pt"), "--workers", "0", "--json", str(link)]
    assert main(evaluate) == 2
    assert "already exists (a symbolic link to" in _one_error_line(capsys)
    assert link.is_symlink()
    output = tmp_path / "out"
    output.symlink_to(tmp_path / "missing-folder")
    assert main(["train", "--data", "mnist", "--max-steps", "1", "--output", str(output)]) == 2
    line = _one_error_line(capsys)
    assert "symbolic link" in line and "does not exist" in line and "File exists" not in line
