"""Data: built-in MNIST, ImageFolder scanning and its errors, corrupt-file skipping, the resumable sampler."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest_train import make_image_folder
from weightformer.data import (
    DataError,
    ResumableSampler,
    SeededTransformDataset,
    SkippedImagesWarning,
    build_transforms,
    open_dataset,
)


def test_builtin_mnist_splits():
    info, splits = open_dataset("mnist")
    assert (info.num_classes, info.in_chans) == (10, 1)
    assert (len(splits["train"]), len(splits["val"])) == (8000, 2000)
    img, label = splits["train"][0]
    assert img.size == (28, 28) and 0 <= label < 10


def test_image_folder_classes_and_samples(tmp_path: Path):
    make_image_folder(tmp_path, classes=("a", "b", "c"), train_per_class=2, val_per_class=1)
    info, splits = open_dataset(str(tmp_path))
    assert info.classes == ("a", "b", "c") and info.in_chans == 3
    assert len(splits["train"]) == 6 and len(splits["val"]) == 3
    assert sorted(label for _, label in splits["train"].samples) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    "layout, message",
    [
        ("missing", "does not exist"),
        ("no_splits", "is not a folder"),
        ("no_classes", "has no class subfolders"),
        ("no_images", "holds no readable images"),
        ("mismatch", "have different classes"),
    ],
)
def test_bad_folders_raise_one_line_errors(tmp_path: Path, layout: str, message: str):
    root = tmp_path / "data"
    if layout == "no_splits":
        root.mkdir()
    elif layout == "no_classes":
        (root / "train").mkdir(parents=True)
        (root / "val").mkdir()
    elif layout == "no_images":
        (root / "train" / "a").mkdir(parents=True)
        (root / "val" / "a").mkdir(parents=True)
    elif layout == "mismatch":
        make_image_folder(root, classes=("a", "b"), train_per_class=1, val_per_class=1)
        (root / "val" / "b").rename(root / "val" / "z")
    with pytest.raises(DataError, match=message) as info:
        open_dataset(str(root))
    assert "\n" not in str(info.value)
    if layout == "mismatch":
        assert "only in train/: ['b']" in str(info.value) and "only in val/: ['z']" in str(info.value)


def test_corrupt_images_are_skipped_and_reported_in_one_line(tmp_path: Path):
    make_image_folder(tmp_path, train_per_class=3, val_per_class=2)
    garbage = [tmp_path / "train" / "cat" / f"broken{i}.jpg" for i in range(3)]
    for path in garbage:
        path.write_bytes(b"this is not a jpeg")
    truncated = tmp_path / "val" / "dog" / "truncated.png"
    truncated.write_bytes((tmp_path / "val" / "dog" / "0.png").read_bytes()[:60])
    with pytest.warns(SkippedImagesWarning) as record:
        info, splits = open_dataset(str(tmp_path))
    assert len(record) == 1
    message = str(record[0].message)
    assert "\n" not in message and "skipped 4 unreadable" in message and "(3 in train/, 1 in val/)" in message
    assert all(str(path) in message for path in garbage) and f"{truncated}" not in message and "and 1 more" in message
    assert info.skipped == (*map(str, garbage), str(truncated))  # the full list, for the run's records
    assert len(splits["train"]) == 6 and len(splits["val"]) == 4


@pytest.mark.parametrize("verify", [True, False])
def test_image_unreadable_at_load_time_is_an_error_not_a_substitute(tmp_path: Path, verify: bool):
    make_image_folder(tmp_path, train_per_class=2, val_per_class=1)
    _, splits = open_dataset(str(tmp_path), verify=verify)
    dataset = splits["val"]
    bad = Path(dataset.samples[0][0])
    bad.write_bytes(b"gone bad after the scan")
    with pytest.raises(DataError, match="cannot read image") as error:
        dataset[0]
    message = str(error.value)
    assert str(bad) in message and "\n" not in message
    assert ("replace or remove it" in message) if verify else ("verify_images=true" in message)
    img, label = dataset[1]  # the other images still load, each under its own index
    assert img.size == (20, 20) and label == dataset.samples[1][1]


def test_truncated_jpeg_passes_the_scan_and_fails_loudly_when_loaded(tmp_path: Path):
    make_image_folder(tmp_path, train_per_class=1, val_per_class=2)
    pixels = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    jpeg = io.BytesIO()
    Image.fromarray(pixels).save(jpeg, "JPEG")
    cut = tmp_path / "val" / "dog" / "cut.jpg"
    cut.write_bytes(jpeg.getvalue()[: len(jpeg.getvalue()) // 2])  # the header is intact, the pixels are not
    info, splits = open_dataset(str(tmp_path), splits=("val",))
    assert info.skipped == () and len(splits["val"]) == 5
    index = [path for path, _ in splits["val"].samples].index(str(cut))
    with pytest.raises(DataError, match=f"cannot read image {cut} .*truncated.*replace or remove it"):
        splits["val"][index]


def test_sampler_shards_cover_the_epoch_and_resume_mid_epoch():
    n, world = 10, 3
    shards = [list(ResumableSampler(n, world, rank, seed=1)) for rank in range(world)]
    assert all(len(s) == 4 for s in shards)  # padded to 12 = 3 x 4
    assert set(sum(shards, [])) == set(range(n))
    sampler = ResumableSampler(n, world, 1, seed=1)
    sampler.set_epoch(0, start=2)
    assert list(sampler) == shards[1][2:] and len(sampler) == 2
    sampler.set_epoch(1)
    assert list(sampler) != shards[1]  # another epoch, another permutation
    val = [list(ResumableSampler(n, world, r, shuffle=False, pad=False)) for r in range(world)]
    assert sorted(sum(val, [])) == list(range(n))  # evaluation: every sample exactly once


def test_seeded_augmentation_depends_only_on_seed_epoch_index(tmp_path: Path):
    make_image_folder(tmp_path, train_per_class=2, val_per_class=1)
    _, splits = open_dataset(str(tmp_path))
    train_tf, _ = build_transforms(16, (0.5,) * 3, (0.5,) * 3, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.5)
    dataset = SeededTransformDataset(splits["train"], train_tf, seed=3)
    first = dataset[1][0]
    torch.rand(5)  # global RNG use in between must not matter
    assert torch.equal(dataset[1][0], first)
    dataset.set_epoch(1)
    assert not torch.equal(dataset[1][0], first)
    state = torch.get_rng_state()
    dataset[0]
    assert torch.equal(torch.get_rng_state(), state)  # the global stream is left as it was


def test_randaugment_posterize_at_full_magnitude_gives_black_instead_of_crashing():
    """The release's rand-m9-mstd0.5-inc1 maps magnitude 10 to 0 bits; Pillow 13 refuses 0 bits."""
    import PIL
    from PIL import Image
    from timm.data import auto_augment

    from weightformer.data.transforms import build_transforms

    train, _ = build_transforms(28, (0.5,) * 3, (0.5,) * 3, auto_augment="rand-m9-mstd0.5-inc1")
    ops = [op for step in train.transforms for op in getattr(step, "ops", ()) if op.name == "PosterizeIncreasing"]
    assert len(ops) == 1
    image = Image.new("RGB", (8, 8), (200, 100, 50))
    (bits,) = auto_augment._posterize_increasing_level_to_arg(10.0, {})
    assert bits == 0
    assert ops[0].aug_fn(image, bits).getextrema() == ((0, 0),) * 3
    assert ops[0].aug_fn(image, 4).getpixel((0, 0)) == (192, 96, 48)  # 4 bits kept, as Pillow does it
    if int(PIL.__version__.split(".")[0]) >= 13:
        with pytest.raises(ValueError):
            auto_augment.posterize(image, bits)  # what timm's own op does here
