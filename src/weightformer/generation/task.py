"""Class-conditional diffusion as a task: images (or cached VAE latents), a WeightFormer-DiT (or DiT)
variant, DiT's hybrid loss, and the validation loss at fixed noise (commands: :mod:`.cli`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import CheckpointError
from ..engine.device import autocast
from ..engine.errors import ConfigError, model_arguments_checked
from ..engine.task import Task, TaskData
from . import recipes
from .cli import CLI
from .config import GenerationConfig

if TYPE_CHECKING:  # imported where they run: the command line needs none of them
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader

    from ..engine.distributed import DistInfo
    from ..models.dit import WeightFormerDiT

__all__ = ["GenerationTask"]

VAL_IMAGES = 512  # the validation loss is measured on the first 512 held-out images


class GenerationTask(Task):
    """Train a class-conditional WeightFormer-DiT (or DiT) with DiT's diffusion; pixel space, or the
    latent space of ``cfg.vae``. Validation: the hybrid loss on the val split at noise and timesteps
    fixed per sample (lower is better)."""

    name = "generation"
    config_class = GenerationConfig
    recipes_module = recipes.__name__
    output_prefix = "gen_"
    best_metric = "loss"
    higher_is_better = False
    curve_metrics = ("loss", "mse")
    cli = CLI

    cfg: GenerationConfig

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> WeightFormerDiT:
        """The WF-DiT (or DiT) a checkpoint's ``meta`` describes, randomly initialised."""
        from ..models.dit_variants import create_dit

        kwargs = dict(meta["model_kwargs"])
        with model_arguments_checked(meta["model"], kwargs):
            return create_dit(meta["model"], input_size=meta["input_size"], in_channels=meta["in_channels"],
                              num_classes=meta["num_classes"], **kwargs)

    @classmethod
    def upgrade_checkpoint(cls, checkpoint: dict[str, Any], version: int) -> dict[str, Any]:
        from ..models.weightformer_long_range import name_unversioned_predictor
        from ..models.dit_variants import LONG_RANGE_VARIANTS

        return name_unversioned_predictor(checkpoint, LONG_RANGE_VARIANTS.values())

    def __init__(self, cfg: GenerationConfig):
        from .data import image_geometry
        from .diffusion import GaussianDiffusion

        super().__init__(cfg)
        self.geometry = image_geometry(cfg.data, cfg.img_size)
        self.diffusion = GaussianDiffusion(learn_sigma=cfg.model_kwargs.get("learn_sigma", True))

    def build_data(self, dist_info: DistInfo) -> TaskData:
        from torch.utils.data import Subset

        from .data import open_images
        from .latents import encode_split, load_vae, vae_downsampling, vae_scale_factor

        cfg, geometry = self.cfg, self.geometry
        hflip = 0.0 if cfg.no_aug else cfg.hflip
        info, splits = open_images(cfg.data, geometry, hflip, cfg.seed, verify=cfg.verify_images,
                                   warn=dist_info.is_main)
        latent = None  # vae path, scale factor, channels, downsampling
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
            latent = {"vae": str(Path(cfg.vae).resolve()), "scale_factor": scale, "channels": channels,
                      "downsampling": factor}
            space = f"latents of {cfg.vae} ({channels} x {geometry.size // factor}², scale {scale:g}, cached)"
        val_count = min(VAL_IMAGES, len(splits["val"]))
        flips = f"flips p={hflip:g}" if hflip else "no flips"
        description = (f"data {cfg.data}: {len(splits['train'])} train images ({val_count} val images for the "
                       f"val loss), {info.num_classes} classes, {space}, {flips}")
        val = Subset(splits["val"], range(val_count))
        meta = {"input_size": geometry.size // latent["downsampling"] if latent else geometry.size,
                "in_channels": latent["channels"] if latent else geometry.channels,
                "num_classes": info.num_classes, "classes": list(info.classes), "latent": latent}
        return TaskData(splits["train"], val, description, meta=meta)

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        cfg, geometry = self.cfg, self.geometry
        meta = {"task": self.name, "model": cfg.model, "model_kwargs": dict(cfg.model_kwargs), **data.meta,
                "image_size": geometry.size, "pad": geometry.pad, "image_channels": geometry.channels,
                "data": cfg.data if not Path(cfg.data).exists() else str(Path(cfg.data).resolve())}
        return self.model_from_meta(meta).to(device), meta

    def check_checkpoint(self, saved: Mapping[str, Any], meta: Mapping[str, Any], source: str,
                         resuming: bool = True) -> None:
        if not saved.get("model"):
            return  # --init from weights without our meta (the authors' DiT checkpoints): they must fit the model
        for key in ("input_size", "in_channels", "num_classes", "latent"):
            if saved.get(key) != meta[key]:
                raise CheckpointError(f"{source} has {key} {saved.get(key)} and this run {meta[key]}; use the data, "
                                      f"--img-size and --vae it was trained with{', or start a new run' if resuming else ''}")

    def training_loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        import torch

        x0, labels = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        t = torch.randint(0, self.diffusion.num_timesteps, (x0.shape[0],), device=device)
        losses = self.diffusion.training_losses(lambda xt, tt: model(xt, tt, labels), x0, t,
                                                min_snr_gamma=self.cfg.min_snr_gamma)
        return losses["loss"].mean(), x0.shape[0]

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, float]:
        """The hybrid loss on the val split, each batch's timesteps and noise drawn from a generator seeded by
        (seed, rank, its first index): every evaluation sees the same draws, the loop's generators untouched."""
        import torch

        from ..engine.distributed import all_reduce_sum
        from ..engine.metrics import FiniteOutputs

        with torch.no_grad():
            was_training = model.training
            model.eval()
            totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss, mse, vb, count
            finite = FiniteOutputs("losses", device)
            index = 0
            for x0, labels in loader:
                x0, labels = x0.to(device), labels.to(device)
                seed = self.cfg.seed * 1_000_003 + index + dist_info.rank * 10**9
                generator = torch.Generator().manual_seed(seed)
                t = torch.randint(0, self.diffusion.num_timesteps, (x0.shape[0],), generator=generator).to(device)
                noise = torch.randn(x0.shape, generator=generator).to(device, x0.dtype)
                with autocast(device, amp):
                    losses = self.diffusion.training_losses(lambda xt, tt, y=labels: model(xt, tt, y), x0, t, noise)
                finite.update(losses["loss"])
                totals += torch.stack([losses["loss"].sum(), losses["mse"].sum(), losses["vb"].sum(),
                                       torch.tensor(float(x0.shape[0]), device=device)]).double()
                index += x0.shape[0]
            model.train(was_training)
            finite.check()
            totals = all_reduce_sum(totals, dist_info)
            n = max(totals[3].item(), 1.0)
            return {"loss": totals[0].item() / n, "mse": totals[1].item() / n, "vb": totals[2].item() / n,
                    "images": int(totals[3].item())}
