"""The bundled data sets' in-memory images as a torch Dataset."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from .errors import DataError


class ArrayImageDataset(Dataset):
    """Images held in memory as a (N, H, W) uint8 array, served as PIL images through a transform."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform: Callable | None = None):
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DataError(f"expected (N, H, W) uint8 images, got shape {images.shape} dtype {images.dtype}")
        self.images = images
        self.labels = labels.astype(np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        img = Image.fromarray(self.images[index], mode="L")
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.labels[index])
