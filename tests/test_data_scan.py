"""Data: scanning ImageFolder trees (symlinks, loops, empty classes, progress), 16-bit images, built-in names,
and DataError coming back from DataLoader workers."""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader
from tqdm import tqdm

import weightformer.data.folder as folder
from conftest_train import make_image_folder
from weightformer.data import BuiltinNameWarning, DataError, open_dataset


def _one_line_error(root: Path, match: str) -> str:
    with pytest.raises(DataError, match=match) as error:
        open_dataset(str(root))
    message = str(error.value)
    assert "\n" not in message
    return message


def _image_paths(dataset) -> list[str]:
    return [path for path, _ in dataset.samples]


# -------------------------------------------------------------------------------------------------
# Symlinks
# -------------------------------------------------------------------------------------------------


def test_symlinks_to_an_image_and_to_a_folder_elsewhere_are_followed(tmp_path: Path):
    root = make_image_folder(tmp_path / "data", train_per_class=2, val_per_class=1)
    extra = make_image_folder(tmp_path / "extra", train_per_class=3, val_per_class=1)
    (root / "train" / "cat" / "more").symlink_to(extra / "train" / "cat")
    (root / "train" / "dog" / "linked.png").symlink_to(extra / "train" / "dog" / "0.png")
    info, splits = open_dataset(str(root))
    paths = _image_paths(splits["train"])
    assert len(paths) == 2 + 3 + 2 + 1 and info.skipped == ()
    assert [label for _, label in splits["train"].samples] == [0] * 5 + [1] * 3
    assert str(root / "train" / "cat" / "more" / "2.png") in paths
    assert str(root / "train" / "dog" / "linked.png") in paths


@pytest.mark.parametrize(
    "link, target",
    [
        ("train/cat/again", "."),  # the folder itself
        ("train/cat/sub/up", "../.."),  # the split folder, two levels up
        ("train/dog", "."),  # a class folder that is the split itself
    ],
)
def test_a_symlink_loop_is_one_error_line_naming_it(tmp_path: Path, link: str, target: str):
    root = make_image_folder(tmp_path / "data", train_per_class=2, val_per_class=1)
    path = root / link
    if path.is_dir():
        for png in path.iterdir():
            png.unlink()
        path.rmdir()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    message = _one_line_error(root, "symlink loop")
    assert str(path) in message and "remove the link" in message


def test_a_loop_through_a_folder_outside_the_tree_is_caught(tmp_path: Path):
    root = make_image_folder(tmp_path / "data", train_per_class=2, val_per_class=1)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "train" / "cat" / "out").symlink_to(outside)
    (outside / "back").symlink_to(root / "train" / "cat")
    message = _one_line_error(root, "symlink loop")
    assert str(root / "train" / "cat" / "out" / "back") in message


def test_two_symlink_loops_end_in_an_error_not_a_hang(tmp_path: Path):
    root = make_image_folder(tmp_path / "data", train_per_class=2, val_per_class=1)
    (root / "train" / "cat" / "a").symlink_to(".")
    (root / "train" / "cat" / "b").symlink_to(".")

    class ScanHangs(Exception):  # not TimeoutError: that is an OSError, which os.walk swallows
        pass

    def give_up(signum, frame):
        raise ScanHangs("the scan of two symlink loops did not end within 10 s")

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(10)
    try:
        _one_line_error(root, "symlink loop")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -------------------------------------------------------------------------------------------------
# Mistakes in the tree
# -------------------------------------------------------------------------------------------------


def test_a_class_folder_without_images_is_an_error(tmp_path: Path):
    root = make_image_folder(tmp_path / "data", classes=("a", "b", "c"), train_per_class=2, val_per_class=1)
    for png in (root / "train" / "b").iterdir():
        png.unlink()
    (root / "train" / "c" / "notes.txt").write_text("not an image")
    for png in (root / "train" / "c").glob("*.png"):
        png.write_bytes(b"broken")
    message = _one_line_error(root, "holds no readable images")
    assert message.startswith(f"{root / 'train' / 'b'} holds no readable images (2 class folders have none: b, c)")
    assert "2 unreadable file(s)" in message and "remove the class folder" in message


def test_a_split_folder_passed_as_data_points_at_its_parent(tmp_path: Path):
    root = make_image_folder(tmp_path / "data", train_per_class=1, val_per_class=1)
    with pytest.raises(DataError, match=re.escape(f"the train/ split itself: pass its parent {root}") + "$"):
        open_dataset(str(root / "train"))


def test_a_split_that_is_a_file_says_so(tmp_path: Path):
    root = make_image_folder(tmp_path / "data", train_per_class=1, val_per_class=1)
    os.rename(root / "val", tmp_path / "val_elsewhere")
    (root / "val").write_bytes(b"an archive, say")
    _one_line_error(root, "val is a file, not a folder")


@pytest.mark.parametrize("folder_name", ["train/dog", "val"])
def test_a_folder_that_cannot_be_listed_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder_name: str):
    root = make_image_folder(tmp_path / "data", train_per_class=1, val_per_class=1)
    locked = root / folder_name
    scandir = os.scandir

    def refuse(path="."):  # as for a folder without read permission (root, running the tests, reads any)
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(folder.os, "scandir", refuse)
    message = _one_line_error(root, "cannot list")
    assert str(locked) in message and "Permission denied" in message


# -------------------------------------------------------------------------------------------------
# 16-bit images
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix, mode", [(".png", "I;16"), (".pgm", "I")])
def test_16_bit_grayscale_is_scaled_not_saturated(tmp_path: Path, suffix: str, mode: str):
    root = make_image_folder(tmp_path / "data", train_per_class=1, val_per_class=1)
    values = np.array([[0, 257 * 100, 65535, 1000, 128, 129]], dtype=np.uint16)
    path = root / "val" / "cat" / f"deep{suffix}"
    Image.fromarray(values).save(path)
    with Image.open(path) as written:
        assert written.mode == mode  # what Pillow makes of a 16-bit file of this kind
    _, splits = open_dataset(str(root), splits=("val",))
    img, _ = splits["val"][_image_paths(splits["val"]).index(str(path))]
    assert img.mode == "RGB"
    assert np.asarray(img)[0, :, 0].tolist() == [0, 100, 255, 4, 0, 1]  # round(x / 257)
    assert (np.asarray(img) == np.asarray(img)[..., :1]).all()  # grey stays grey


# -------------------------------------------------------------------------------------------------
# Built-in names
# -------------------------------------------------------------------------------------------------


def test_a_local_folder_named_like_a_builtin_is_pointed_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    make_image_folder(tmp_path / "mnist", train_per_class=1, val_per_class=1)
    with pytest.warns(BuiltinNameWarning) as record:
        info, _ = open_dataset("mnist", splits=("val",))
    assert info.in_chans == 1 and len(record) == 1  # the built-in one is used
    assert str(record[0].message) == (
        "using the built-in mnist data set, not the folder ./mnist; pass --data ./mnist to use the folder"
    )
    info, _ = open_dataset("./mnist", splits=("val",))
    assert info.in_chans == 3 and info.name == str((tmp_path / "mnist").resolve())


def test_a_builtin_name_without_a_local_folder_is_silent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist").write_text("a file, not a folder")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_dataset("mnist", splits=("val",))


# -------------------------------------------------------------------------------------------------
# Progress
# -------------------------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_scan_shows_progress_on_a_terminal_and_closes_its_bars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = make_image_folder(tmp_path / "data", train_per_class=2, val_per_class=1)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(folder, "PROGRESS_DELAY_S", 0.0)
    open_dataset(str(root), warn=False)  # other ranks: silent
    assert terminal.getvalue() == ""
    open_dataset(str(root))
    shown = terminal.getvalue()
    for line in ("listing train/", "checking train/ images", "listing val/", "checking val/ images"):
        assert line in shown
    assert "%|" in shown  # tqdm bars
    before = set(tqdm._instances)
    (root / "val" / "dog" / "loop").symlink_to(".")
    with pytest.raises(DataError, match="symlink loop"):
        open_dataset(str(root))
    assert set(tqdm._instances) <= before  # the bar of the failed scan was closed


# -------------------------------------------------------------------------------------------------
# DataError through DataLoader workers
# -------------------------------------------------------------------------------------------------


def test_data_error_from_a_worker_keeps_its_type_and_one_line(tmp_path: Path):
    root = make_image_folder(tmp_path / "data", train_per_class=1, val_per_class=2)
    _, splits = open_dataset(str(root), splits=("val",))
    bad = Path(splits["val"].samples[1][0])
    bad.write_bytes(b"changed after the scan")
    with pytest.raises(DataError) as direct:
        splits["val"][1]
    loader = DataLoader(splits["val"], batch_size=None, num_workers=1, collate_fn=lambda sample: sample)
    with pytest.raises(DataError) as from_worker:
        list(loader)
    assert str(from_worker.value) == str(direct.value) and str(bad) in str(direct.value)


def test_data_error_rebuilt_from_torchs_reraise_text_is_the_original_line():
    try:
        try:
            raise OSError("image file is truncated")
        except OSError as exc:
            raise DataError("cannot read image x.jpg (OSError: truncated); replace or remove it") from exc
    except DataError:
        wrapper = ExceptionWrapper(where="in DataLoader worker process 3")
    with pytest.raises(DataError) as error:
        wrapper.reraise()
    assert str(error.value) == "cannot read image x.jpg (OSError: truncated); replace or remove it"
    unrelated = "Caught DataError somewhere, but not in torch's words"
    assert str(DataError(unrelated)) == unrelated
