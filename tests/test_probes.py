"""The long-range probe data sets: labels right by construction (checked from the pixels alone), seeded
determinism, and their use as built-in data sets of the training CLI."""

from collections import deque

import numpy as np
import pytest
from PIL import Image, ImageFilter

from weightformer.cli import main
from weightformer.data import BUILTIN_DATASETS, DataError, open_dataset
from weightformer.data.probes import (
    GLYPH_BANK,
    PROBES,
    glyph_count,
    glyph_match,
    path_link,
)


def _glyph_box(image: np.ndarray, cols: slice) -> np.ndarray:
    """The ink inside ``cols``, cropped to its bounding box."""
    part = image[:, cols] > 0
    rows, columns = np.nonzero(part)
    return part[rows.min():rows.max() + 1, columns.min():columns.max() + 1]


@pytest.mark.parametrize("size", [32, 64])
def test_glyph_match_labels_compare_the_two_edge_glyphs(size):
    images, labels = glyph_match(40, size=size, seed=3)
    assert set(labels.tolist()) == {0, 1}
    for image, label in zip(images, labels):
        left, right = _glyph_box(image, slice(0, size // 2)), _glyph_box(image, slice(size // 2, size))
        same = left.shape == right.shape and bool((left == right).all())
        assert same == bool(label)


def test_glyph_count_label_is_copies_minus_one():
    size = 64
    scale, box = 2, 10
    bank = [np.kron(g, np.ones((scale, scale), bool)) for g in GLYPH_BANK]
    images, labels = glyph_count(40, size=size, seed=5)
    assert set(labels.tolist()) == {0, 1, 2, 3}
    for image, label in zip(images, labels):
        ink = image > 0
        top = int(np.nonzero(ink.any(1))[0][0])  # every glyph has ink in its first row and column
        left = int(np.nonzero(ink[top:top + box].any(0))[0][0])
        window = ink[top:top + box, left:left + box]
        glyph = next(g for g in bank if g.shape == window.shape and (g == window).all())
        assert ink.sum() == (label + 1) * glyph.sum()


def _components(mask: np.ndarray) -> np.ndarray:
    """8-connected component labels of a boolean mask (breadth-first search)."""
    labels = np.zeros(mask.shape, int)
    count = 0
    for start in zip(*np.nonzero(mask)):
        if labels[start]:
            continue
        count += 1
        labels[start] = count
        queue = deque([start])
        while queue:
            y, x = queue.popleft()
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    ny, nx = y + dy, x + dx
                    if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not labels[ny, nx]:
                        labels[ny, nx] = count
                        queue.append((ny, nx))
    return labels


def test_path_link_label_is_whether_the_markers_are_connected():
    images, labels = path_link(16, size=64, seed=7)
    assert set(labels.tolist()) == {0, 1}
    for image, label in zip(images, labels):
        # Markers are 7x7 squares; lines are 2 px wide: a 5x5 erosion keeps only the markers' cores.
        cores = np.asarray(Image.fromarray(image).filter(ImageFilter.MinFilter(5))) > 0
        core_labels = _components(cores)
        assert core_labels.max() == 2
        ink = _components(image > 0)
        first, second = (ink[core_labels == k][0] for k in (1, 2))
        assert (first == second) == bool(label)


@pytest.mark.parametrize("name", sorted(PROBES))
def test_probes_are_deterministic_in_their_seed(name):
    generate = PROBES[name][0]
    a, la = generate(12, size=32, seed=1)
    b, lb = generate(12, size=32, seed=1)
    c, _ = generate(12, size=32, seed=2)
    assert a.shape == (12, 32, 32) and a.dtype == np.uint8
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    assert not np.array_equal(a, c)


def test_probe_names_with_options_open_as_builtin_data_sets():
    info, splits = open_dataset("glyph_match:size=32,train=10,val=6,seed=4")
    assert (info.num_classes, info.in_chans) == (2, 1)
    assert (len(splits["train"]), len(splits["val"])) == (10, 6)
    assert splits["train"].images.shape[1:] == (32, 32)
    assert not np.array_equal(splits["train"].images[:6], splits["val"].images)  # separate seed streams
    assert BUILTIN_DATASETS["path_link"].img_size == 64
    assert "mnist" in BUILTIN_DATASETS and "glyph_count:size=48" in BUILTIN_DATASETS
    with pytest.raises(DataError, match="probe option"):
        open_dataset("glyph_match:pixels=3")
    with pytest.raises(DataError, match="at least 32"):
        open_dataset("glyph_match:size=8")


def test_train_cli_reports_a_bad_probe_option_in_one_line(tmp_path, capsys):
    code = main(["train", "--data", "glyph_count:colour=2", "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: probe option 'colour=2'")
