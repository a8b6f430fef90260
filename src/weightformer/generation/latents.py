"""Latent space through diffusers' AutoencoderKL, read from a local folder, and latents precomputed
once per split and cached as safetensors (as fast-DiT does: one posterior sample per image)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ..data.errors import DataError
from ..engine.errors import ConfigError
from ..engine.metrics import json_text
from ..engine.outputs import write_atomic
from ..progress import progress as progress_lines

__all__ = ["decode", "encode_split", "load_vae", "vae_downsampling", "vae_scale_factor"]


def load_vae(path: str, device: torch.device) -> nn.Module:
    """The AutoencoderKL saved in the local folder ``path`` (``save_pretrained`` layout), in eval mode."""
    from diffusers import AutoencoderKL

    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(f"--vae {path}: no AutoencoderKL there (no config.json); pass a local folder written by "
                          f"AutoencoderKL.save_pretrained, e.g. a download of stabilityai/sd-vae-ft-ema")
    try:
        vae = AutoencoderKL.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--vae {path}: cannot load an AutoencoderKL ({exc})") from None
    return vae.to(device).eval().requires_grad_(False)


def vae_scale_factor(vae: nn.Module) -> float:
    """The latent scale (0.18215 for Stable Diffusion's VAE) from the VAE's config."""
    return float(getattr(vae.config, "scaling_factor", 0.18215))


def vae_downsampling(vae: nn.Module) -> int:
    """The VAE's spatial reduction: 2 per encoder block after the first (8 for Stable Diffusion's)."""
    return 2 ** (len(vae.config.block_out_channels) - 1)


def _fit_channels(x: Tensor, channels: int) -> Tensor:  # grey images repeated to the VAE's RGB input
    if x.shape[1] == channels:
        return x
    if x.shape[1] == 1:
        return x.expand(-1, channels, -1, -1)
    raise DataError(f"the images have {x.shape[1]} channels and the VAE takes {channels}; use data the VAE fits")


def _cached_key(sidecar: Path) -> str | None:
    """The key a cache's sidecar records; None where there is none to read (a save killed between its files)."""
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return None
    return record.get("key") if isinstance(record, dict) else None


@torch.no_grad()
def encode_split(vae: nn.Module, images: Dataset, cache_dir: Path | None, key: str, batch_size: int,
                 device: torch.device, seed: int, progress: bool = True) -> TensorDataset:
    """(scaled latent, label) pairs of ``images``, read from ``cache_dir`` when it holds this ``key`` (the VAE,
    the data and the geometry), else encoded with one seeded posterior sample per image and saved there."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    cache = cache_dir / f"{digest}.safetensors" if cache_dir is not None else None
    if cache is not None and cache.is_file() and _cached_key(cache.with_suffix(".json")) == digest:
        tensors = load_file(cache)
        return TensorDataset(tensors["latents"], tensors["labels"])
    scale = vae_scale_factor(vae)
    generator = torch.Generator(device).manual_seed(seed)
    latents, labels = [], []
    loader = DataLoader(images, batch_size=batch_size, shuffle=False)
    for x, y in progress_lines(loader, desc="encoding latents", unit="batch", enabled=progress):
        x = _fit_channels(x.to(device), vae.config.in_channels)
        z = vae.encode(x).latent_dist.sample(generator) * scale
        latents.append(z.float().cpu())
        labels.append(y)
    tensors = {"latents": torch.cat(latents).contiguous(), "labels": torch.cat(labels).long()}
    if cache is not None:
        write_atomic(cache, save(tensors))
        write_atomic(cache.with_suffix(".json"), json_text({"key": digest}))
    return TensorDataset(tensors["latents"], tensors["labels"])


@torch.no_grad()
def decode(vae: nn.Module, z: Tensor, scale: float) -> Tensor:
    """Scaled latents -> images in [-1, 1] (B, C, H, W)."""
    return vae.decode(z / scale).sample.clamp(-1, 1)
