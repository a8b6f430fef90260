"""``gen sample`` and ``gen eval`` as functions, e.g.

    loaded = load_generator("runs/gen_mnist_wf_dit_s_4/last.pt")        # its EMA weights
    images, labels = generate(loaded, num_per_class=8, cfg_scale=4.0)   # uint8 (80, 28, 28, 1), int64 (80,)
    save_samples(images, labels, Path("samples"))                       # samples.npz and grid.png
    scores = evaluate_samples_file(Path("samples"), checkpoint="runs/gen_mnist_wf_dit_s_4/last.pt")
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from ..data import BUILTIN_DATASETS
from ..engine.errors import ConfigError
from ..engine.metrics import FiniteOutputs
from ..engine.outputs import write_atomic
from ..engine.weights import LoadedModel, load_model
from .data import image_geometry, open_images, to_uint8
from .diffusion import GaussianDiffusion
from .evaluation import find_inception, inception_metrics, judge_metrics, train_judge
from .latents import decode, load_vae
from .sampling import sample

__all__ = ["evaluate_samples", "evaluate_samples_file", "generate", "load_generator", "read_samples",
           "reference_images", "save_grid", "save_samples"]


def load_generator(checkpoint: str, use_ema: bool | None = None, device: str | torch.device = "cpu") -> LoadedModel:
    """A ``gen train`` checkpoint's model and meta on ``device``: with ``use_ema`` None its EMA weights if it has
    them, else raw; True insists on EMA, False takes the raw weights."""
    return load_model(checkpoint, task="generation", use_ema=use_ema, device=device)


def generate(loaded: LoadedModel, num_per_class: int, classes: Sequence[int] | None = None, steps: int = 250,
             sampler: str = "ddpm", cfg_scale: float = 1.5, guidance: str | None = None, seed: int = 0,
             batch_size: int = 64, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``num_per_class`` samples of each of ``classes`` (default: all) as uint8 (N, H, W, C) images and int64
    (N,) labels; the same ``seed`` gives the same images on the same device and build."""
    model, meta = loaded.model, loaded.meta
    if cfg_scale < 1:
        raise ConfigError(f"--cfg-scale must be at least 1 (1: no guidance, 1.5 for FID, 4.0 for pictures), got {cfg_scale}")
    if num_per_class < 1 or steps < 1 or steps > 1000:
        raise ConfigError(f"--num-per-class must be at least 1 and --steps in [1, 1000], got {num_per_class} and {steps}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    num = meta["num_classes"]
    chosen = list(range(num)) if not classes else list(classes)
    bad = [c for c in chosen if not 0 <= c < num]
    if bad:
        raise ConfigError(f"class label(s) {bad} unknown: this model knows classes 0 to {num - 1}; pass --classes "
                          f"in that range")
    labels = torch.tensor([c for c in chosen for _ in range(num_per_class)], dtype=torch.long)
    device, latent = next(model.parameters()).device, meta.get("latent")
    vae = load_vae(latent["vae"], device) if latent else None
    diffusion = GaussianDiffusion(learn_sigma=model.learn_sigma)
    generator = torch.Generator(device).manual_seed(seed)
    images, finite = [], FiniteOutputs("samples", device)
    for batch in labels.split(batch_size):
        x = sample(model, diffusion, batch.to(device), steps, sampler, cfg_scale, guidance, clip=vae is None,
                   generator=generator, progress=progress)  # (B, in_channels, input_size, input_size)
        if vae is not None:
            x = decode(vae, x, latent["scale_factor"])  # (B, 3, image_size, image_size)
            x = x[:, :1] if meta["image_channels"] == 1 else x
        finite.update(x)
        images.append(to_uint8(x.float(), meta["pad"]))
    finite.check()
    return np.concatenate(images), labels.numpy().astype(np.int64)


def save_grid(images: np.ndarray, labels: np.ndarray, path: Path, upscale: int = 2) -> None:
    """One row per class, written atomically as PNG."""
    classes = sorted(set(labels.tolist()))
    per_row = max(int((labels == c).sum()) for c in classes)
    H, W, C = images.shape[1:]
    grid = np.full((len(classes) * (H + 2), per_row * (W + 2), C), 255, np.uint8)
    for r, c in enumerate(classes):
        for k, img in enumerate(images[labels == c]):
            grid[r * (H + 2) + 1: r * (H + 2) + 1 + H, k * (W + 2) + 1: k * (W + 2) + 1 + W] = img
    pil = Image.fromarray(grid[..., 0] if C == 1 else grid)
    pil = pil.resize((pil.width * upscale, pil.height * upscale), Image.NEAREST)
    write_atomic(path, lambda f: pil.save(f, format="PNG"))


def save_samples(images: np.ndarray, labels: np.ndarray, out: Path) -> None:
    """``out/samples.npz`` (images, labels) and ``out/grid.png``, each written atomically."""
    write_atomic(out / "samples.npz", lambda f: np.savez(f, images=images, labels=labels))
    save_grid(images, labels, out / "grid.png")


def read_samples(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The uint8 (N, H, W, C) images and int64 (N,) labels of a ``samples.npz`` (or of the one in ``path``)."""
    path = path / "samples.npz" if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; pass the samples.npz written by weightformer gen sample")
    what = f"{path} is not a samples.npz written by weightformer gen sample"
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):  # a single .npy array
            raise ValueError
        with archive as f:
            members, arrays = f.zip.namelist(), {k: f[k] for k in ("images", "labels") if k in f.files}
    except (OSError, ValueError, EOFError):  # not an .npz archive, or one of pickled objects (never unpickled)
        raise ConfigError(f"{what} (not a NumPy .npz archive of plain arrays)") from None
    if any(name.endswith("data.pkl") for name in members):  # torch.save's zip layout
        raise ConfigError(f"{what} but a PyTorch file (a checkpoint?); gen eval scores the samples.npz that "
                          f"weightformer gen sample --checkpoint CKPT --out DIR writes: pass DIR/samples.npz")
    missing = [k for k in ("images", "labels") if k not in arrays]
    if missing:
        raise ConfigError(f"{what} (it has no {' or '.join(missing)} array; it needs images and labels)")
    images, labels = arrays["images"], arrays["labels"]
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ConfigError(f"{what}: its images are {images.dtype} {tuple(images.shape)}, and samples are uint8 "
                          f"(N, H, W, 1 or 3) in 0..255; convert float images in [0, 1] with (x * 255).round()")
    if not np.issubdtype(labels.dtype, np.integer) or labels.shape != images.shape[:1]:
        raise ConfigError(f"{what}: its labels are {labels.dtype} {tuple(labels.shape)}, and samples need one "
                          f"integer class per image")
    return images, labels


def reference_images(data: str, image_size: int, pad: int, max_images: int | None = None,
                     split: str = "val") -> tuple[np.ndarray, np.ndarray, int]:
    """A split of ``data`` as the samples' uint8 (N, H, W, C) images and labels, and its class count."""
    geometry = image_geometry(data, image_size)
    if geometry.pad != pad:
        raise ConfigError(f"{data} gives {geometry.pad} px padding at {image_size} px and the samples {pad}; "
                          "evaluate against the data the model was trained on")
    info, splits = open_images(data, geometry, 0.0, 0, warn=False)
    dataset = splits[split]
    count = len(dataset) if max_images is None else min(max_images, len(dataset))
    xs, ys = zip(*(dataset[i] for i in range(count)))
    return to_uint8(torch.stack(xs), pad), np.asarray(ys, dtype=np.int64), info.num_classes


def evaluate_samples(samples: np.ndarray, labels: np.ndarray, data: str, image_size: int, pad: int,
                     inception: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Scores of ``samples`` against ``data``'s held-out split: the judge's and, with local Inception weights,
    FID / IS / precision / recall; ``notes`` says what was not computed."""
    if len(samples) < 2:  # a covariance, and so a Fréchet distance, needs two images
        raise ConfigError(f"{len(samples)} sample(s) to score; a Fréchet distance needs at least 2: sample more")
    reference, ref_labels, num_classes = reference_images(data, image_size, pad)
    if samples.shape[1:] != reference.shape[1:]:
        raise ConfigError(f"the samples are {samples.shape[1:]} and the {data} images {reference.shape[1:]}; "
                          "evaluate samples against the data their model was trained on")
    if labels.max() >= num_classes:
        raise ConfigError(f"sample labels go up to {labels.max()} and {data} has {num_classes} classes")
    train_x, train_y, _ = reference_images(data, image_size, pad, split="train")
    judge = train_judge(train_x, train_y, num_classes, progress=progress)
    result: dict[str, Any] = {"samples": len(samples), "reference_images": len(reference),
                              **judge_metrics(judge, samples, labels, reference, ref_labels)}
    weights = find_inception(inception)
    notes = [("judge_fd is the Frechet distance of a small classifier's features trained on this data: "
              "NOT comparable to published FID"), "sFID is not computed (torch-fidelity has no spatial features)"]
    if weights is None:
        notes.insert(0, "the standard Inception weights are not on this machine (torch-fidelity's "
                        "weights-inception-2015-12-05-6726825d.pth; pass --inception PATH), so FID, IS, precision "
                        "and recall were not computed")
    else:
        result.update(inception_metrics(samples, reference, weights))
    result["notes"] = notes
    return result


def evaluate_samples_file(samples: Path, checkpoint: str | None = None, data: str = "mnist",
                          inception: str | None = None, progress: bool = True) -> dict[str, Any]:
    """:func:`evaluate_samples` of a ``samples.npz`` (or its folder) against ``checkpoint``'s data at its
    geometry, or else against ``data`` at the samples' own size."""
    images, labels = read_samples(samples)
    if checkpoint is not None:
        meta = load_generator(checkpoint, use_ema=False).meta
        data, size, pad = meta["data"], meta["image_size"], meta["pad"]
    else:
        spec = BUILTIN_DATASETS.get(data)
        size, pad = (spec.img_size if spec else images.shape[1]), 0  # samples are cropped back to the images' size
    return evaluate_samples(images, labels, data, size, pad, inception, progress=progress)
