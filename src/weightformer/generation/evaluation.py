"""Scores of generated images: FID, Inception Score, precision and recall by torch-fidelity with its Inception
weights on disk; always, a *judge*'s (a small CNN trained on the data's training split, cached under
``~/.cache/weightformer/judges``): the samples' class accuracy and a Fréchet distance of its features."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save
from torch import Tensor, nn

from ..engine.outputs import write_atomic
from ..progress import progress as progress_lines

__all__ = ["INCEPTION_FILE", "Judge", "frechet_distance", "inception_metrics", "judge_metrics", "train_judge"]

INCEPTION_FILE = "weights-inception-2015-12-05-6726825d.pth"  # what torch-fidelity downloads
# The judge's recipe: 6 epochs of AdamW with a one-cycle rate and ±2 px random shifts (its accuracy on the
# bundled MNIST: docs/generation.md).
JUDGE_EPOCHS, JUDGE_BATCH, JUDGE_LR, JUDGE_SHIFT = 6, 128, 5e-3, 2
JUDGE_VERSION = 2  # part of the cache key: a judge cached by another recipe is not reused


def _conv_bn(cin: int, cout: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


class Judge(nn.Module):
    """A small CNN classifier of uint8 images: three conv-BN-ReLU stages, 3×3 pooling, 128-d ``features``."""

    def __init__(self, channels: int, num_classes: int):
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(channels, 16), nn.MaxPool2d(2), *_conv_bn(16, 32), nn.MaxPool2d(2),
                                  *_conv_bn(32, 64), nn.AdaptiveAvgPool2d(3), nn.Flatten(),  # (B, 64 * 3 * 3)
                                  nn.Linear(64 * 9, 128), nn.ReLU())
        self.head = nn.Linear(128, num_classes)

    def features(self, images: Tensor) -> Tensor:  # uint8 (B, H, W, C) -> (B, 128)
        return self.body(images.permute(0, 3, 1, 2).float() / 127.5 - 1)

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.features(images))


def _random_shift(images: Tensor, shift: int, generator: torch.Generator) -> Tensor:
    """Each uint8 image (B, H, W, C) moved by up to ``shift`` px along each axis, zero-filled."""
    b, h, w, _ = images.shape
    padded = F.pad(images, (0, 0, shift, shift, shift, shift))  # (B, H + 2s, W + 2s, C)
    dy, dx = torch.randint(0, 2 * shift + 1, (2, b), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + torch.arange(w))[:, None, :]  # (B, 1, W)
    return padded[torch.arange(b)[:, None, None], rows, cols]


def train_judge(images: np.ndarray, labels: np.ndarray, num_classes: int, seed: int = 0,
                progress: bool = True) -> Judge:
    """The judge trained on uint8 ``images`` (N, H, W, C) and ``labels``; cached by the data's hash."""
    judge = Judge(images.shape[-1], num_classes)
    digest = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "weightformer" / "judges"
    path = cache / f"judge_{digest}_v{JUDGE_VERSION}_e{JUDGE_EPOCHS}.safetensors"
    if path.is_file():
        judge.load_state_dict(load_file(path))
        return judge.eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        judge = Judge(images.shape[-1], num_classes)
    x, y = torch.from_numpy(images), torch.from_numpy(labels).long()
    steps_per_epoch = -(-len(x) // JUDGE_BATCH)
    optimizer = torch.optim.AdamW(judge.parameters(), lr=JUDGE_LR)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, JUDGE_LR, total_steps=JUDGE_EPOCHS * steps_per_epoch)
    judge.train()
    for _ in progress_lines(range(JUDGE_EPOCHS), desc="training the judge", unit="epoch", enabled=progress):
        for batch in torch.randperm(len(x), generator=generator).split(JUDGE_BATCH):
            loss = F.cross_entropy(judge(_random_shift(x[batch], JUDGE_SHIFT, generator)), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    write_atomic(path, save(judge.state_dict()))
    return judge.eval()


@torch.no_grad()
def _judge_outputs(judge: Judge, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    feats, preds = [], []
    for batch in torch.from_numpy(images).split(256):
        f = judge.features(batch)
        feats.append(f.double().numpy())
        preds.append(judge.head(f).argmax(1).numpy())
    return np.concatenate(feats), np.concatenate(preds)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """FID's ‖μ_a − μ_b‖² + Tr(Σ_a + Σ_b − 2(Σ_aΣ_b)^½) of feature sets (N, D), Tr((Σ_aΣ_b)^½) from the eigenvalues
    of the PSD Σ_a^½ Σ_b Σ_a^½: pytorch-fid's value without the offset its ``sqrtm`` needs for singular Σ."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.atleast_2d(np.cov(a, rowvar=False)), np.atleast_2d(np.cov(b, rowvar=False))
    values, vectors = np.linalg.eigh(cov_a)
    root_a = (vectors * np.sqrt(values.clip(min=0))) @ vectors.T  # Σ_a^½
    inner = np.linalg.eigvalsh(root_a @ cov_b @ root_a)
    trace_covmean = np.sqrt(inner.clip(min=0)).sum()
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a) + np.trace(cov_b) - 2 * trace_covmean)


def judge_metrics(judge: Judge, samples: np.ndarray, sample_labels: np.ndarray, reference: np.ndarray,
                  reference_labels: np.ndarray) -> dict[str, Any]:
    """Class-conditional accuracy of the samples, the judge's accuracy on the reference, and the
    Fréchet distance of their features (``judge_fd``, not comparable to published FID)."""
    sample_feats, sample_preds = _judge_outputs(judge, samples)
    ref_feats, ref_preds = _judge_outputs(judge, reference)
    return {"class_accuracy": float((sample_preds == sample_labels).mean()),
            "judge_reference_accuracy": float((ref_preds == reference_labels).mean()),
            "judge_fd": frechet_distance(sample_feats, ref_feats)}


def find_inception(explicit: str | None) -> Path | None:
    """The Inception weights file: ``explicit``, or torch-fidelity's download in the torch hub cache."""
    candidates = [Path(explicit)] if explicit else []
    candidates.append(Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_FILE)
    return next((p for p in candidates if p.is_file()), None)


def inception_metrics(samples: np.ndarray, reference: np.ndarray, weights: Path) -> dict[str, float]:
    """FID, Inception Score and precision/recall by torch-fidelity from local Inception weights."""
    import torch_fidelity

    class _Images(torch.utils.data.Dataset):
        def __init__(self, images: np.ndarray):
            self.images = images

        def __len__(self) -> int:
            return len(self.images)

        def __getitem__(self, i: int) -> Tensor:  # uint8 (3, H, W), grey repeated to RGB
            x = torch.from_numpy(self.images[i]).permute(2, 0, 1)
            return x.expand(3, -1, -1).contiguous() if x.shape[0] == 1 else x

    result = torch_fidelity.calculate_metrics(
        input1=_Images(samples), input2=_Images(reference), fid=True, isc=True, prc=True, verbose=False,
        feature_extractor="inception-v3-compat", feature_extractor_weights_path=str(weights), cuda=torch.cuda.is_available(),
    )
    return {"fid": result["frechet_inception_distance"], "inception_score": result["inception_score_mean"],
            "precision": result["precision"], "recall": result["recall"]}
