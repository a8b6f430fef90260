"""Helpers shared by the training, data, CLI, resume and distributed tests (imported explicitly)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from PIL import Image

# A model small enough that a few optimizer steps take well under a second on one CPU core.
TINY_MODEL = {"patch_size": 4, "embed_dim": 32, "depth": 3}


def make_image_folder(
    root: Path,
    classes: tuple[str, ...] = ("cat", "dog"),
    train_per_class: int = 8,
    val_per_class: int = 4,
    size: int = 20,
    seed: int = 0,
) -> Path:
    """An ImageFolder tree of random RGB PNGs whose mean colour depends on the class."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for index, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                base = 60 + 120 * index
                pixels = np.clip(rng.normal(base, 40, (size, size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def tiny_config(data: Path | str, output: Path, **overrides: Any) -> dict[str, Any]:
    """Settings for a fast CPU run on ``data``: tiny WeightFormer, 16 px, batch 4, no workers."""
    config = {
        "data": str(data),
        "output": str(output),
        "model": "weightformer_tiny",
        "model_kwargs": dict(TINY_MODEL),
        "img_size": 16,
        "batch_size": 4,
        "epochs": 2,
        "warmup_epochs": 1,
        "workers": 0,
        "lr": 5e-3,
        "log_interval": 1000,
        "device": "cpu",
    }
    config.update(overrides)
    return config


def weights(path: Path, key: str = "model") -> dict[str, torch.Tensor]:
    """The ``key`` state dict of a checkpoint written by train."""
    return torch.load(path, map_location="cpu", weights_only=True)[key]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Every tensor bit-identical."""
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread for the block: tiny convolutions run slower on several, above all on a
    shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
