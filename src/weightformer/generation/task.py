"""Class-conditional diffusion as a task of the shared loop: images (or cached VAE latents), a
WeightFormer-DiT (or DiT) variant, DiT's hybrid loss, and the validation loss at fixed noise;
``weightformer gen train|sample|eval``.

Its recipes (:mod:`.recipes`): the offline MNIST job's for the bundled sets, DiT's for a folder of
real size, the offline job's settings sized to a smaller folder otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoint import CheckpointError
from ..engine.device import autocast
from ..engine.errors import ConfigError, model_arguments_checked
from ..engine.recipes import Recipe, RecipeChoice
from ..engine.task import Command, Task, TaskData
from . import recipes
from .config import GenerationConfig

if TYPE_CHECKING:  # the training code below imports them where it runs: the command line needs none of them
    import torch
    from torch import Tensor, nn
    from torch.utils.data import DataLoader

    from ..engine.distributed import DistInfo
    from .model import WeightFormerDiT

__all__ = ["GenerationTask"]

VAL_IMAGES = 512  # the validation loss is measured on the first 512 held-out images


class GenerationTask(Task):
    """Train a class-conditional WeightFormer-DiT (or DiT) with DiT's diffusion; pixel space, or the
    latent space of ``cfg.vae``. Validation: the hybrid loss on the val split at noise and timesteps
    fixed per sample (lower is better)."""

    name = "generation"
    cli_name = "gen"
    description = ("Class-conditional diffusion with WeightFormer-DiT (or the attention DiT) on the bundled MNIST "
                   "or an ImageFolder tree: train, sample, evaluate.")
    config_class = GenerationConfig
    output_prefix = "gen_"
    best_metric = "loss"
    higher_is_better = False
    curve_metrics = ("loss", "mse")

    cfg: GenerationConfig

    @classmethod
    def recipes(cls) -> Sequence[Recipe]:
        return recipes.recipes()

    @classmethod
    def choose_recipe(cls, data: str, settings: Mapping[str, Any]) -> RecipeChoice:
        return recipes.choose_recipe(data, settings)

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> WeightFormerDiT:
        """The WF-DiT (or DiT) a checkpoint's ``meta`` describes, randomly initialised."""
        from .variants import create_dit

        kwargs = dict(meta["model_kwargs"])
        with model_arguments_checked(meta["model"], kwargs):
            return create_dit(meta["model"], input_size=meta["input_size"], in_channels=meta["in_channels"],
                              num_classes=meta["num_classes"], **kwargs)

    @classmethod
    def commands(cls) -> Sequence[Command]:
        from .cli import COMMANDS

        return COMMANDS

    @classmethod
    def next_command(cls, checkpoint: Path) -> str:
        """Sampling comes first: ``gen eval`` scores a folder of samples."""
        return f"{cls.command()} sample --checkpoint {checkpoint} --out {Path(checkpoint).parent / 'samples'}"

    def __init__(self, cfg: GenerationConfig):
        from .data import image_geometry
        from .diffusion import GaussianDiffusion

        super().__init__(cfg)
        self.geometry = image_geometry(cfg.data, cfg.img_size)
        self.diffusion = GaussianDiffusion(learn_sigma=cfg.model_kwargs.get("learn_sigma", True))
        self.num_classes = 0
        self.classes: list[str] = []
        self.latent: dict[str, Any] | None = None  # vae path, scale factor, channels

    def build_data(self, dist_info: DistInfo) -> TaskData:
        from torch.utils.data import Subset

        from .data import open_images
        from .latents import encode_split, load_vae, vae_downsampling, vae_scale_factor

        cfg, geometry = self.cfg, self.geometry
        hflip = 0.0 if cfg.no_aug else cfg.hflip
        info, splits = open_images(cfg.data, geometry, hflip, cfg.seed, verify=cfg.verify_images,
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
        flips = f"flips p={hflip:g}" if hflip else "no flips"
        description = (f"data {cfg.data}: {len(splits['train'])} train images ({val_count} val images for the "
                       f"val loss), {info.num_classes} classes, {space}, {flips}")
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
        return self.model_from_meta(meta).to(device), meta

    def check_checkpoint(self, meta: dict[str, Any], source: str, resuming: bool = True) -> None:
        if not meta.get("model"):
            return  # --init from weights without our meta (the authors' DiT checkpoints): they must fit the model
        mine = self.meta()
        for key in ("input_size", "in_channels", "num_classes", "latent"):
            if meta.get(key) != mine[key]:
                raise CheckpointError(f"{source} has {key} {meta.get(key)} and this run {mine[key]}; use the data, "
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
        """The hybrid loss on the val split; each batch draws its timesteps and noise from a generator
        seeded by (seed, rank, its first index), so every evaluation sees the same draws and the loop's
        generators are untouched."""
        import torch

        from ..engine.distributed import all_reduce_sum

        with torch.no_grad():
            was_training = model.training
            model.eval()
            totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss, mse, vb, count
            index = 0
            for x0, labels in loader:
                x0, labels = x0.to(device), labels.to(device)
                seed = self.cfg.seed * 1_000_003 + index + dist_info.rank * 10**9
                generator = torch.Generator().manual_seed(seed)
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
