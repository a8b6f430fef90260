"""``weightformer data pack | verify``: tar shards of a folder or a bundled set, read back and checked; resume
after an interruption, the output policy, and bad sources and shards."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image
from timm.data import create_dataset

from weightformer.cli import main
from weightformer.data import load_builtin
from weightformer.data import pack as pack_module
from weightformer.data.folder import SkippedImagesWarning
from weightformer.data.pack import INFO_FILE, PLAN_FILE, pack_dataset, verify_shards
from weightformer.engine.errors import ConfigError

from conftest_train import make_image_folder

PROBE = "glyph_match:size=32,train=12,val=5"


def members(shard: Path) -> dict[str, bytes]:
    with tarfile.open(shard) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def folder_with_formats(root: Path) -> Path:
    """Two classes of PNGs, one JPEG and one BMP in train/."""
    make_image_folder(root, train_per_class=4, val_per_class=2, size=16)
    pixels = np.random.default_rng(1).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "train" / "cat" / "photo.jpg", quality=90)
    Image.fromarray(pixels).save(root / "train" / "dog" / "scan.bmp")
    return root


def test_pack_keeps_jpeg_and_png_bytes_and_verify_counts_them(tmp_path: Path):
    src = folder_with_formats(tmp_path / "src")
    info = pack_dataset(str(src), tmp_path / "out", shard_size=4, verbose=False)
    assert info["classes"] == ["cat", "dog"] and info["in_chans"] == 3
    train = info["splits"]["train"]
    assert train["num_samples"] == 10 and train["shard_lengths"] == [4, 4, 2] and train["class_counts"] == [5, 5]
    assert train["filenames"] == [f"train/train-00000{i}.tar" for i in range(3)]
    assert json.loads((tmp_path / "out" / INFO_FILE).read_text()) == info
    assert not (tmp_path / "out" / PLAN_FILE).exists()

    files = {}
    for name in train["filenames"]:
        files.update(members(tmp_path / "out" / name))
    images = {name: data for name, data in files.items() if not name.endswith(".cls")}
    assert len(images) == 10 and sum(name.endswith(".jpg") for name in images) == 1
    jpeg = next(data for name, data in images.items() if name.endswith(".jpg"))
    assert jpeg == (src / "train" / "cat" / "photo.jpg").read_bytes()  # the file's own bytes, not re-encoded
    originals = {p.read_bytes() for p in (src / "train").rglob("*.png")}
    assert originals < set(images.values())
    bmp = Image.open(src / "train" / "dog" / "scan.bmp").convert("RGB")  # the one other format: a lossless PNG
    converted = [Image.open(io.BytesIO(d)) for n, d in images.items() if n.endswith(".png") and d not in originals]
    assert len(converted) == 1 and np.array_equal(np.asarray(converted[0]), np.asarray(bmp))
    labels = {name[: -len(".cls")]: int(data) for name, data in files.items() if name.endswith(".cls")}
    assert sorted(labels.values()) == [0] * 5 + [1] * 5

    reports = verify_shards(tmp_path / "out", workers=2, verbose=False)
    assert [(r.name, r.samples, r.class_counts, r.shards, r.problems) for r in reports] == [
        ("train", 10, [5, 5], 3, []), ("val", 4, [2, 2], 1, [])]

    from weightformer.data.shards import open_shards  # training reads the pack's class names and counts

    classes, streams = open_shards(tmp_path / "out", {"train": "train", "val": "val"}, warn=False)
    assert classes == ("cat", "dog") and len(streams["train"].index) == 10 and len(streams["val"].index) == 4


def test_pack_of_a_bundled_set_through_the_command_line(tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main(["data", "pack", PROBE, str(out), "--shard-size", "5"]) == 0
    info = json.loads((out / INFO_FILE).read_text())
    assert info["source"] == PROBE and info["in_chans"] == 1 and info["splits"]["train"]["shard_lengths"] == [5, 5, 2]
    sample = next(iter(wds.WebDataset(str(out / "train" / "train-000000.tar"), shardshuffle=False)))
    assert Image.open(io.BytesIO(sample["png"])).size == (32, 32) and int(sample["cls"]) < info["num_classes"]
    streamed = create_dataset("wds/probe", root=str(out), split="val", is_training=False, batch_size=1)
    assert len(streamed) == 5 and sorted(int(label) for _, label in streamed) == sorted(
        int(label) for _, label in load_builtin(PROBE)[1]["val"])  # timm's reader takes _info.json as it is
    assert main(["data", "verify", str(out)]) == 0
    assert "train: 12 samples in 3 shard(s)" in capsys.readouterr().out
    assert main(["data", "pack", PROBE, str(tmp_path / "other"), "--splits", "test"]) == 2
    assert "has no split test (it has: train, val); pass --splits" in capsys.readouterr().err


def test_an_interrupted_pack_resumes_with_the_shards_it_finished(tmp_path: Path, monkeypatch):
    src = make_image_folder(tmp_path / "src", train_per_class=5, val_per_class=1, size=8)
    reference = pack_dataset(str(src), tmp_path / "whole", shard_size=3, verbose=False)
    written = []
    real = pack_module._write_shard

    def stopped_at_the_third(stream, split, indices):
        if len(written) == 2:
            stream.write(b"half a shard")
            raise KeyboardInterrupt
        written.append(len(indices))
        real(stream, split, indices)

    monkeypatch.setattr(pack_module, "_write_shard", stopped_at_the_third)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        pack_dataset(str(src), out, shard_size=3, verbose=False)
    assert sorted(p.name for p in (out / "train").iterdir()) == ["train-000000.tar", "train-000001.tar"]
    assert (out / PLAN_FILE).is_file() and not (out / INFO_FILE).exists()
    with pytest.raises(ConfigError, match="unfinished pack of another source or other settings"):
        pack_dataset(str(src), out, shard_size=4, verbose=False)
    (out / "train" / ".train-000002.tar.x1y2.tmp").write_bytes(b"left by a killed pack")
    first = (out / "train" / "train-000000.tar").stat()

    monkeypatch.setattr(pack_module, "_write_shard", real)
    assert pack_dataset(str(src), out, shard_size=3, verbose=False) == reference
    assert (out / "train" / "train-000000.tar").stat().st_mtime_ns == first.st_mtime_ns  # kept, not rewritten
    for name in reference["splits"]["train"]["filenames"] + reference["splits"]["val"]["filenames"]:
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert sorted(p.name for p in (out / "train").iterdir()) == [f"train-00000{i}.tar" for i in range(4)]
    assert all(not r.problems for r in verify_shards(out, verbose=False))


def test_a_source_changed_since_the_interruption_is_refused(tmp_path: Path, monkeypatch):
    src = make_image_folder(tmp_path / "src", train_per_class=2, val_per_class=1, size=8)
    out = tmp_path / "out"

    def interrupted(stream, split, indices):
        raise KeyboardInterrupt

    monkeypatch.setattr(pack_module, "_write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pack_dataset(str(src), out, verbose=False)
    Image.new("RGB", (8, 8)).save(src / "train" / "cat" / "new.png")
    with pytest.raises(ConfigError, match="source changed since"):
        pack_dataset(str(src), out, verbose=False)


def test_an_existing_out_is_never_overwritten_unasked(tmp_path: Path, capsys):
    src = make_image_folder(tmp_path / "src", train_per_class=2, val_per_class=1, size=8)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["data", "pack", str(src), str(out)]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"
    assert main(["data", "pack", str(src), str(out), "--overwrite"]) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("out.previous-")]
    assert len(aside) == 1 and (aside[0] / "notes.txt").read_text() == "mine"
    assert main(["data", "pack", str(src), str(out)]) == 2
    assert "(a finished pack)" in capsys.readouterr().err
    assert main(["data", "pack", str(src), str(src / "train"), "--overwrite"]) == 2  # never onto the source
    assert "is inside the source" in capsys.readouterr().err and (src / "train" / "cat").is_dir()
    assert main(["data", "pack", str(src / "train"), str(src), "--overwrite"]) == 2
    assert "would write over the command's input" in capsys.readouterr().err


def test_corrupt_source_images_are_left_out_or_found_by_verify(tmp_path: Path, capsys):
    src = make_image_folder(tmp_path / "src", train_per_class=3, val_per_class=1, size=16)
    (src / "train" / "cat" / "garbage.jpg").write_bytes(b"not an image")
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    (src / "train" / "dog" / "cut.jpg").write_bytes(buffer.getvalue()[:2000])  # its header opens; its pixels do not
    out = tmp_path / "out"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = pack_dataset(str(src), out, verbose=True)
    assert [w.category for w in caught] == [SkippedImagesWarning]
    assert info["skipped"] == [str(src / "train" / "cat" / "garbage.jpg")]
    assert info["splits"]["train"]["num_samples"] == 7
    assert main(["data", "verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train/: 1 undecodable image(s) (train_" in err
    assert main(["data", "verify", str(out), "--no-decode"]) == 0


def test_verify_reports_truncated_unlabelled_and_missing_shards(tmp_path: Path, capsys):
    src = make_image_folder(tmp_path / "src", train_per_class=6, val_per_class=2, size=16)
    out = tmp_path / "out"
    pack_dataset(str(src), out, shard_size=4, verbose=False)
    shard = out / "train" / "train-000000.tar"
    shard.write_bytes(shard.read_bytes()[:1700])  # cut inside the second sample
    with open(out / "train" / "train-000001.tar", "wb") as f:  # a sample without its .cls
        writer = wds.TarWriter(f)
        writer.write({"__key__": "a", "png": b"x", "cls": 0})
        writer.write({"__key__": "b", "png": (src / "train" / "cat" / "0.png").read_bytes()})
        writer.close()
    (out / "val" / "val-000000.tar").unlink()
    (out / "train" / "extra.tar").write_bytes(b"")
    [train, val] = verify_shards(out, workers=1, verbose=False)
    assert train.problems == ["1 truncated or unreadable tar(s) (train-000000.tar)",
                              "1 shard(s) with another sample count than the info's (train-000001.tar)",
                              "1 sample(s) without a class label in 0..1", "1 undecodable image(s) (a)",
                              f"1 .tar file(s) not in {INFO_FILE} (extra.tar)",
                              f"{train.samples} samples read, the info says 12", "samples per class differ from the info's"]
    assert val.problems == ["1 shard(s) missing (val-000000.tar)", "0 samples read, the info says 4",
                            "samples per class differ from the info's"]
    assert main(["data", "verify", str(out)]) == 1
    assert main(["data", "verify", str(tmp_path / "src")]) == 2
    assert "has no _info.json" in capsys.readouterr().err


def test_a_pack_that_cannot_write_and_odd_packs_are_one_line(tmp_path: Path, capsys):
    src = make_image_folder(tmp_path / "src", train_per_class=2, val_per_class=1, size=8)
    (tmp_path / "file").write_text("")
    assert main(["data", "pack", str(src), str(tmp_path / "file" / "out")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    locked = tmp_path / "locked"  # an OUT this user cannot write in: read-only, or immutable for root
    locked.mkdir(mode=0o555)
    if os.access(locked, os.W_OK) and subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode:
        pytest.skip("no way to make a folder this user cannot write in")
    try:
        assert main(["data", "pack", str(src), str(locked)]) == 2
        assert "cannot write to OUT" in capsys.readouterr().err
    finally:
        subprocess.run(["chattr", "-i", str(locked)], capture_output=True)
    # The file-size limit, as a full disk: one line (exit 1), no shard under its name nor a temporary; then resumed.
    out = tmp_path / "out"
    limited = ("import resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000)); "
               "from weightformer.cli import main; sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", limited, "data", "pack", str(src), str(out)], capture_output=True,
                         text=True)
    assert run.returncode == 1 and run.stderr.splitlines()[-1:] == [run.stderr.strip()]
    assert run.stderr.startswith(f"error: cannot write {out / 'train' / 'train-000000.tar'}: file too large")
    assert not list((out / "train").iterdir())
    assert main(["data", "pack", str(src), str(out)]) == 0 and main(["data", "verify", str(out)]) == 0
    # Shards are no source to pack; a pack of another format is not verified.
    assert main(["data", "pack", str(out), str(tmp_path / "again")]) == 2
    assert "not images in class folders" in capsys.readouterr().err
    with open(out / "val" / "val-000000.tar", "wb") as f:  # a label int() refuses, though str.isdigit() takes it
        writer = wds.TarWriter(f)
        writer.write({"__key__": "a", "png": (src / "val" / "cat" / "0.png").read_bytes(), "cls": "²".encode()})
        writer.close()
    problems = verify_shards(out, verbose=False)[1].problems
    assert "1 sample(s) without a class label in 0..1" in problems and not any("truncated" in p for p in problems)
    info = json.loads((out / INFO_FILE).read_text())
    (out / INFO_FILE).write_text(json.dumps({**info, "format": "weightformer-pack-2", "splits": []}))
    assert main(["data", "verify", str(out)]) == 2
    assert "is a pack of format weightformer-pack-2; this version reads" in capsys.readouterr().err


def test_a_folder_that_refuses_writes_mid_pack_is_one_line_and_the_pack_resumes(tmp_path: Path, capsys,
                                                                               monkeypatch):
    """Permission taken away after OUT was checked (a folder another user locks, an ACL): the shards written so
    far stay, the command prints one line (exit 2, the user's to fix, no traceback) and a rerun finishes."""
    import errno
    import tempfile

    from weightformer import atomic

    src = make_image_folder(tmp_path / "src", train_per_class=5, val_per_class=1, size=8)
    out = tmp_path / "out"
    real, calls = tempfile.mkstemp, []

    def denied_after_two_shards(*args, **kwargs):
        calls.append(kwargs.get("dir"))
        if len([d for d in calls if Path(d).name == "train"]) > 2:
            raise PermissionError(errno.EACCES, "Permission denied", str(kwargs["dir"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(atomic.tempfile, "mkstemp", denied_after_two_shards)
    assert main(["data", "pack", str(src), str(out), "--shard-size", "3"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [f"error: cannot use {out / 'train'}: Permission denied; pass a path you may read "
                                f"and write, or change its permissions"]
    assert sorted(p.name for p in (out / "train").iterdir()) == ["train-000000.tar", "train-000001.tar"]
    monkeypatch.setattr(atomic.tempfile, "mkstemp", real)
    assert main(["data", "pack", str(src), str(out), "--shard-size", "3"]) == 0
    assert main(["data", "verify", str(out)]) == 0
