"""Class-conditional diffusion as a task of the shared loop: images (or cached VAE latents), a
WeightFormer-DiT (or DiT) variant, DiT's hybrid loss, and the validation loss at fixed noise.

The recipe is DiT's: AdamW at 1e-4 (a total batch of 256), no weight decay, a constant rate, EMA 0.9999,
label dropout 0.1. :data:`MNIST_DEFAULTS` shrinks it for the offline job (see docs/generation.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from ..checkpoint import CheckpointError
from ..engine.config import TrainConfig
from ..engine.distributed import DistInfo, all_reduce_sum
from ..engine.errors import ConfigError
from ..engine.evaluate import autocast
from ..engine.task import Task, TaskData
from .data import image_geometry, open_images
from .diffusion import GaussianDiffusion
from .latents import encode_split, load_vae, vae_downsampling, vae_scale_factor
from .model import WeightFormerDiT
from .variants import DIT_VARIANTS, create_dit

__all__ = ["MNIST_DEFAULTS", "PAPER_DEFAULTS", "GenerationTask", "build_generator_model"]

# DiT's recipe, in the loop's terms: lr per total batch of 512 (2e-4 -> 1e-4 at DiT's 256), min_lr = lr
# (constant), no warm-up, no weight decay, no clipping; augmentations are the task's own (flips).
PAPER_DEFAULTS: dict[str, Any] = dict(
    model="wf_dit_s_2", model_kwargs={}, img_size=256, epochs=80, batch_size=256, lr=2e-4, min_lr=2e-4, warmup_lr=2e-4,
    warmup_epochs=0, weight_decay=0.0, opt="adamw", clip_grad=None, ema=True, ema_decay=0.9999, hflip=0.5,
    workers=4, min_snr_gamma=None,
)
# The offline job: a narrow WF-DiT at patch 4 on the unpadded 28 px digits (a 7x7 token grid: 1.3x
# the images per second of 32 px padded, 8x8), small batches (more steps for the same compute: this
# job is step-bound), a cosine rate from 8e-3 at batch 32 (4e-3 reached 47% class accuracy instead of
# 68%; 1.6e-2 was behind after 3 epochs), an EMA of 0.99 (the job has 3,250 steps; 0.9999 averages
# over ~10k), a fixed σ (plain ε-MSE loss, no VLB term: at this scale the learned σ's VLB term
# cost class accuracy) and Min-SNR loss weights with γ = 1 (71% -> 97% class accuracy at the same
# compute, DDPM 250 at cfg 4; γ = 2: 93%, γ = 5: 88%): the high-noise steps, where class and shape
# are decided, get the model's capacity. docs/generation.md has the runs that chose each setting.
MNIST_DEFAULTS: dict[str, Any] = dict(
    model="wf_dit_s_4", model_kwargs=dict(hidden_size=64, depth=6, learn_sigma=False), img_size=28, epochs=13,
    batch_size=32, lr=1.28e-1, min_lr=1.28e-2, warmup_lr=1.28e-3, warmup_epochs=0, weight_decay=0.0, opt="adamw",
    clip_grad=1.0, ema=True, ema_decay=0.99, hflip=0.0, workers=0, min_snr_gamma=1.0,
)
VAL_IMAGES = 512  # the validation loss is measured on the first 512 held-out images


def build_generator_model(meta: Mapping[str, Any]) -> WeightFormerDiT:
    """The model a checkpoint's ``meta`` describes, randomly initialised."""
    try:
        return create_dit(meta["model"], input_size=meta["input_size"], in_channels=meta["in_channels"],
                          num_classes=meta["num_classes"], **meta["model_kwargs"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"cannot build {meta['model']} with model_kwargs {dict(meta['model_kwargs'])} ({exc})") from None


class GenerationTask(Task):
    """Train a class-conditional WeightFormer-DiT (or DiT) with DiT's diffusion; pixel space, or the
    latent space of ``cfg.vae``. Validation: the hybrid loss on the val split at noise and timesteps
    fixed per sample (lower is better)."""

    name = "generation"
    command = "weightformer gen"
    output_prefix = "gen_"
    best_metric = "loss"
    higher_is_better = False
    curve_metrics = ("loss", "mse")

    def next_command(self, checkpoint: Path) -> str:
        """Sampling comes first: ``gen eval`` scores a folder of samples."""
        return f"{self.command} sample --checkpoint {checkpoint} --out {checkpoint.parent / 'samples'}"

    def __init__(self, cfg: TrainConfig):
        super().__init__(cfg)
        if cfg.model not in DIT_VARIANTS:
            raise ConfigError(f"--model {cfg.model} is not a diffusion model; choose one of {', '.join(DIT_VARIANTS)}")
        self.geometry = image_geometry(cfg.data, cfg.img_size)
        self.diffusion = GaussianDiffusion(learn_sigma=cfg.model_kwargs.get("learn_sigma", True))
        self.num_classes = 0
        self.classes: list[str] = []
        self.latent: dict[str, Any] | None = None  # vae path, scale factor, channels

    def build_data(self, dist_info: DistInfo) -> TaskData:
        cfg, geometry = self.cfg, self.geometry
        info, splits = open_images(cfg.data, geometry, cfg.hflip, cfg.seed, verify=cfg.verify_images,
                                   warn=dist_info.is_main)
        self.num_classes, self.classes = info.num_classes, list(info.classes)
        space = f"pixels, {geometry.size}² x {geometry.channels}"
        if geometry.pad:
            space += f" ({geometry.size - 2 * geometry.pad} px padded by {geometry.pad})"
        if cfg.vae is not None:
            vae = load_vae(cfg.vae, dist_info.device)
            scale, factor = vae_scale_factor(vae), vae_downsampling(vae)
            if geometry.size % factor:
                raise ConfigError(f"img_size {geometry.size} must be a multiple of the VAE's downsampling, {factor}")
            cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "weightformer" / "latents"
            for split in ("train", "val"):
                key = f"{Path(cfg.vae).resolve()}|{info.name}|{split}|{geometry}|{cfg.seed}"
                splits[split] = encode_split(vae, splits[split], cache, key, cfg.batch_size, dist_info.device,
                                             cfg.seed, dist_info.is_main)
            channels = splits["train"].tensors[0].shape[1]
            self.latent = {"vae": str(Path(cfg.vae).resolve()), "scale_factor": scale, "channels": channels,
                           "downsampling": factor}
            space = f"latents of {cfg.vae} ({channels} x {geometry.size // factor}², scale {scale:g}, cached)"
        val_count = min(VAL_IMAGES, len(splits["val"]))
        description = (f"data {cfg.data}: {len(splits['train'])} train images ({val_count} val images for the "
                       f"val loss), {info.num_classes} classes, {space}")
        val = Subset(splits["val"], range(val_count))
        return TaskData(splits["train"], val, description)

    def meta(self) -> dict[str, Any]:
        latent_side = self.geometry.size // self.latent["downsampling"] if self.latent else 0
        return {
            "task": self.name, "model": self.cfg.model, "model_kwargs": dict(self.cfg.model_kwargs),
            "input_size": latent_side if self.latent else self.geometry.size,
            "in_channels": self.latent["channels"] if self.latent else self.geometry.channels,
            "num_classes": self.num_classes, "classes": self.classes, "image_size": self.geometry.size,
            "pad": self.geometry.pad, "image_channels": self.geometry.channels, "latent": self.latent,
            "data": self.cfg.data if not Path(self.cfg.data).exists() else str(Path(self.cfg.data).resolve()),
        }

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        meta = self.meta()
        return build_generator_model(meta).to(device), meta

    def check_checkpoint(self, meta: dict[str, Any], source: str, resuming: bool = True) -> None:
        if meta.get("task") != self.name:
            raise CheckpointError(f"{source} is not a generation checkpoint (task {meta.get('task', 'classification')}); "
                                  "pass one written by weightformer gen train")
        mine = self.meta()
        for key in ("input_size", "in_channels", "num_classes", "latent"):
            if meta.get(key) != mine[key]:
                raise CheckpointError(f"{source} has {key} {meta.get(key)} and this run {mine[key]}; use the data, "
                                      f"--img-size and --vae it was trained with{', or start a new run' if resuming else ''}")

    def training_loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        x0, labels = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        t = torch.randint(0, self.diffusion.num_timesteps, (x0.shape[0],), device=device)
        losses = self.diffusion.training_losses(lambda xt, tt: model(xt, tt, labels), x0, t,
                                                min_snr_gamma=self.cfg.min_snr_gamma)
        return losses["loss"].mean(), x0.shape[0]

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, float]:
        """The hybrid loss on the val split; each batch draws its timesteps and noise from a generator
        seeded by (seed, rank, its first index), so every evaluation sees the same draws and the loop's
        generators are untouched."""
        was_training = model.training
        model.eval()
        totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss, mse, vb, count
        index = 0
        for x0, labels in loader:
            x0, labels = x0.to(device), labels.to(device)
            generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + index + dist_info.rank * 10**9)
            t = torch.randint(0, self.diffusion.num_timesteps, (x0.shape[0],), generator=generator).to(device)
            noise = torch.randn(x0.shape, generator=generator).to(device, x0.dtype)
            with autocast(device, amp):
                losses = self.diffusion.training_losses(lambda xt, tt, y=labels: model(xt, tt, y), x0, t, noise)
            totals += torch.stack([losses["loss"].sum(), losses["mse"].sum(), losses["vb"].sum(),
                                   torch.tensor(float(x0.shape[0]), device=device)]).double()
            index += x0.shape[0]
        model.train(was_training)
        totals = all_reduce_sum(totals, dist_info)
        n = max(totals[3].item(), 1.0)
        return {"loss": totals[0].item() / n, "mse": totals[1].item() / n, "vb": totals[2].item() / n,
                "images": int(totals[3].item())}

    def summary(self, metrics: dict[str, Any]) -> str:
        return (f"val loss {metrics['loss']:.4f} (mse {metrics['mse']:.4f} + vb {metrics['vb']:.4f}, "
                f"{metrics['images']} images)")

    def format_score(self, value: float) -> str:
        return f"val loss {value:.4f}"
