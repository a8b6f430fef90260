"""Class-conditional sampling: DDPM or DDIM over a respaced schedule, with classifier-free guidance."""

from __future__ import annotations

import torch
from torch import Tensor

from ..models.dit import WeightFormerDiT
from ..progress import progress as progress_lines
from .config import SAMPLERS
from .diffusion import GaussianDiffusion, respaced_timesteps

__all__ = ["SAMPLERS", "sample"]


def _guided_output(model: WeightFormerDiT, x: Tensor, t: int, labels: Tensor, cfg_scale: float,
                   guidance: str | None) -> Tensor:
    """The model's (ε, v) for x (B, C, H, W) at timestep t; with cfg_scale > 1 by DiT's batched guidance."""
    B = x.shape[0]
    if cfg_scale == 1.0:
        return model(x, torch.full((B,), t, device=x.device), labels)
    null = torch.full_like(labels, model.num_classes)
    out = model.forward_with_cfg(torch.cat([x, x]), torch.full((2 * B,), t, device=x.device),
                                 torch.cat([labels, null]), cfg_scale, guidance=guidance)
    return out[:B]


@torch.no_grad()
def sample(model: WeightFormerDiT, diffusion: GaussianDiffusion, labels: Tensor, steps: int = 250,
           sampler: str = "ddpm", cfg_scale: float = 1.0, guidance: str | None = None, clip: bool = True,
           eta: float = 0.0, generator: torch.Generator | None = None, progress: bool = False) -> Tensor:
    """Samples (B, in_channels, input_size, input_size) of ``labels`` (B,) in the model's space (pixels or
    latents); ``generator`` fixes every draw; ``clip`` clamps the predicted x0 to [-1, 1] (pixels only). A sample
    for which the model predicted a non-finite value at any step is returned as NaN, never as a clamped image."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    if cfg_scale < 1.0:
        raise ValueError(f"cfg_scale must be at least 1 (1: no guidance), got {cfg_scale}")
    model.eval()
    param = next(model.parameters())
    shape = (labels.shape[0], model.in_channels, model.input_size, model.input_size)
    x = torch.randn(shape, generator=generator, device=param.device, dtype=param.dtype)
    timesteps = respaced_timesteps(diffusion.num_timesteps, steps)
    scheduler = diffusion.ddpm_scheduler(timesteps, clip) if sampler == "ddpm" else None
    steps_shown = progress_lines(timesteps, desc=f"{sampler} {steps} steps", unit="step", enabled=progress)
    finite = torch.ones(shape[0], dtype=torch.bool, device=x.device)  # (B,) no non-finite prediction so far
    for i, t in enumerate(steps_shown):
        out = _guided_output(model, x, t, labels, cfg_scale, guidance)
        finite &= out.flatten(1).isfinite().all(1)
        if scheduler is not None:
            x = scheduler.step(out, t, x, generator=generator).prev_sample
        else:
            t_prev = timesteps[i + 1] if i + 1 < len(timesteps) else -1
            x = diffusion.ddim_step(out, x, t, t_prev, eta=eta, clip=clip, generator=generator)
    return torch.where(finite[:, None, None, None], x, torch.nan)
