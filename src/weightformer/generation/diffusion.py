"""DiT's Gaussian diffusion: a linear β schedule over 1000 steps, ε-prediction with learned σ, the hybrid loss
L_simple + L_vlb, and DDPM or DDIM reverse steps on a respaced schedule. The model's second half of channels
v ∈ [-1, 1] sets log σ² = ((v+1)/2)·log β_t + (1 − (v+1)/2)·log β̃_t (β̃_t the posterior variance). L_vlb trains
v only: KL(q(x_{t-1}|x_t,x_0) ‖ p(x_{t-1}|x_t)) in bits per dimension, the discretised Gaussian decoder NLL at
t = 0 (diffusers has no VLB). Sampling uses DiT's respacing, timesteps round(linspace(0, 999, K)), the model
fed the original timestep. The DDPM step is diffusers' ``DDPMScheduler`` (learned_range, custom timesteps),
DiT's exactly; the DDIM step is written here: diffusers' ``DDIMScheduler`` steps from t to t − 1000/K, not to
the previous timestep of the rounded linspace."""

from __future__ import annotations

import math

import numpy as np
import torch
from diffusers import DDPMScheduler
from torch import Tensor

__all__ = ["GaussianDiffusion", "discretized_gaussian_log_likelihood", "linear_betas", "normal_kl", "respaced_timesteps"]

NUM_TIMESTEPS = 1000


def linear_betas(num_steps: int = NUM_TIMESTEPS) -> np.ndarray:
    """DiT's (and DDPM's) linear schedule, β from 1e-4 to 0.02 scaled by 1000/num_steps, float64."""
    scale = 1000 / num_steps
    return np.linspace(scale * 1e-4, scale * 0.02, num_steps, dtype=np.float64)


def respaced_timesteps(num_steps: int, count: int) -> list[int]:
    """DiT's ``space_timesteps(num_steps, str(count))``: ``count`` evenly spaced timesteps, rounded, descending."""
    if not 1 <= count <= num_steps:
        raise ValueError(f"the number of sampling steps must be in [1, {num_steps}], got {count}")
    return [int(t) for t in np.linspace(0, num_steps - 1, count).round()[::-1]]


def normal_kl(mean1: Tensor, logvar1: Tensor, mean2: Tensor, logvar2: Tensor) -> Tensor:
    """KL(N(mean1, e^logvar1) ‖ N(mean2, e^logvar2)), elementwise, in nats."""
    return 0.5 * (-1.0 + logvar2 - logvar1 + torch.exp(logvar1 - logvar2) + (mean1 - mean2) ** 2 * torch.exp(-logvar2))


def _approx_standard_normal_cdf(x: Tensor) -> Tensor:  # ADM's tanh approximation of Φ
    return 0.5 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def discretized_gaussian_log_likelihood(x: Tensor, means: Tensor, log_scales: Tensor) -> Tensor:
    """log p(x) of data in [-1, 1] quantised to 256 levels under N(means, e^{2·log_scales}), elementwise, nats."""
    centered, inv_std = x - means, torch.exp(-log_scales)
    cdf_plus = _approx_standard_normal_cdf(inv_std * (centered + 1.0 / 255.0))
    cdf_min = _approx_standard_normal_cdf(inv_std * (centered - 1.0 / 255.0))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=1e-12))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=1e-12))
    log_delta = torch.log((cdf_plus - cdf_min).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_plus, torch.where(x > 0.999, log_one_minus_cdf_min, log_delta))


def _mean_flat(x: Tensor) -> Tensor:
    return x.mean(dim=tuple(range(1, x.dim())))


class GaussianDiffusion:
    """The 1000-step process with its float64 coefficients, the training loss, and reverse steps. With
    ``learn_sigma`` the model returns (ε, v), 2C channels, and the loss adds the VLB term; else ε alone."""

    def __init__(self, num_timesteps: int = NUM_TIMESTEPS, learn_sigma: bool = True):
        self.num_timesteps, self.learn_sigma = num_timesteps, learn_sigma
        betas = linear_betas(num_timesteps)
        acp = np.cumprod(1.0 - betas)
        acp_prev = np.append(1.0, acp[:-1])
        posterior_var = betas * (1.0 - acp_prev) / (1.0 - acp)
        table = dict(
            betas=betas, alphas_cumprod=acp, sqrt_acp=np.sqrt(acp), sqrt_one_minus_acp=np.sqrt(1.0 - acp),
            sqrt_recip_acp=np.sqrt(1.0 / acp), sqrt_recipm1_acp=np.sqrt(1.0 / acp - 1.0),
            # log β̃ with β̃_0 = 0 replaced by β̃_1, as ADM/DiT
            posterior_log_var=np.log(np.append(posterior_var[1], posterior_var[1:])),
            posterior_coef_x0=betas * np.sqrt(acp_prev) / (1.0 - acp),
            posterior_coef_xt=(1.0 - acp_prev) * np.sqrt(1.0 - betas) / (1.0 - acp),
        )
        self.table = {k: torch.from_numpy(v) for k, v in table.items()}

    def _at(self, name: str, t: Tensor, like: Tensor) -> Tensor:
        """Coefficient ``name`` at timesteps t (B,), as (B, 1, 1, 1) in ``like``'s dtype and device."""
        values = self.table[name].to(t.device)[t].to(like.dtype)
        return values.view(-1, *([1] * (like.dim() - 1)))

    def q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = √ᾱ_t·x0 + √(1−ᾱ_t)·ε."""
        return self._at("sqrt_acp", t, x0) * x0 + self._at("sqrt_one_minus_acp", t, x0) * noise

    def q_posterior_mean(self, x0: Tensor, xt: Tensor, t: Tensor) -> Tensor:
        return self._at("posterior_coef_x0", t, xt) * x0 + self._at("posterior_coef_xt", t, xt) * xt

    def p_mean_log_variance(self, model_output: Tensor, xt: Tensor, t: Tensor,
                            clip: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(mean, log variance, predicted x0) of p(x_{t-1} | x_t) from the model's (ε, v) output."""
        C = xt.shape[1]
        eps = model_output[:, :C]
        if self.learn_sigma:
            frac = (model_output[:, C:] + 1) / 2
            min_log = self._at("posterior_log_var", t, xt)
            max_log = torch.log(self._at("betas", t, xt))
            log_var = frac * max_log + (1 - frac) * min_log
        else:
            log_var = self._at("posterior_log_var", t, xt).expand_as(xt)
        x0 = self._at("sqrt_recip_acp", t, xt) * xt - self._at("sqrt_recipm1_acp", t, xt) * eps
        if clip:
            x0 = x0.clamp(-1, 1)
        return self.q_posterior_mean(x0, xt, t), log_var, x0

    def vlb_bits(self, model_output: Tensor, x0: Tensor, xt: Tensor, t: Tensor) -> Tensor:
        """L_t in bits per dimension, (B,): the KL to the posterior for t > 0, the decoder NLL at t = 0."""
        true_mean = self.q_posterior_mean(x0, xt, t)
        true_log_var = self._at("posterior_log_var", t, xt)
        mean, log_var, _ = self.p_mean_log_variance(model_output, xt, t)
        kl = _mean_flat(normal_kl(true_mean, true_log_var, mean, log_var)) / math.log(2.0)
        nll = -_mean_flat(discretized_gaussian_log_likelihood(x0, mean, 0.5 * log_var)) / math.log(2.0)
        return torch.where(t == 0, nll, kl)

    def snr(self, t: Tensor) -> Tensor:  # ᾱ_t / (1 − ᾱ_t) at timesteps t (B,), float64
        acp = self.table["alphas_cumprod"].to(t.device)[t]
        return acp / (1.0 - acp)

    def training_losses(self, model_output_fn, x0: Tensor, t: Tensor, noise: Tensor | None = None,
                        min_snr_gamma: float | None = None) -> dict[str, Tensor]:
        """Per-sample (B,) ``mse`` (L_simple), ``vb`` (mean frozen; 0 without learned σ) and ``loss = w_t·mse + vb``:
        w_t = 1 (DiT), or Min-SNR's min(SNR_t, γ)/SNR_t with ``min_snr_gamma`` = γ (Hang et al., arXiv 2303.09556).
        ``model_output_fn(x_t, t)`` runs the model."""
        noise = torch.randn_like(x0) if noise is None else noise
        xt = self.q_sample(x0, t, noise)
        out = model_output_fn(xt, t)
        C = x0.shape[1]
        mse = _mean_flat((noise - out[:, :C]) ** 2)
        if self.learn_sigma:
            frozen = torch.cat([out[:, :C].detach(), out[:, C:]], dim=1)
            vb = self.vlb_bits(frozen, x0, xt, t) * (self.num_timesteps / 1000.0)
        else:
            vb = torch.zeros_like(mse)
        weighted = mse
        if min_snr_gamma is not None:
            snr = self.snr(t)
            weighted = mse * (snr.clamp(max=min_snr_gamma) / snr).to(mse.dtype)
        return {"loss": weighted + vb, "mse": mse, "vb": vb}

    def ddpm_scheduler(self, timesteps: list[int], clip: bool) -> DDPMScheduler:
        """diffusers' DDPM step over ``timesteps`` (descending, to 0), with this process's float64 ᾱ."""
        scheduler = DDPMScheduler(num_train_timesteps=self.num_timesteps, beta_schedule="linear", beta_start=1e-4,
                                  beta_end=0.02, variance_type="learned_range" if self.learn_sigma else "fixed_small_log",
                                  clip_sample=clip, prediction_type="epsilon")
        scheduler.set_timesteps(timesteps=timesteps)
        scheduler.alphas_cumprod = self.table["alphas_cumprod"].clone()
        scheduler.one = torch.tensor(1.0, dtype=torch.float64)
        return scheduler

    def ddim_step(self, model_output: Tensor, xt: Tensor, t: int, t_prev: int, eta: float = 0.0, clip: bool = False,
                  generator: torch.Generator | None = None) -> Tensor:
        """DiT's DDIM step from t to t_prev (−1: x0), ε re-derived from the (clipped) x0; η = 0: deterministic."""
        acp, eps = self.table["alphas_cumprod"], model_output[:, :xt.shape[1]]
        a_t, a_prev = acp[t].item(), acp[t_prev].item() if t_prev >= 0 else 1.0
        x0 = (xt - math.sqrt(1 - a_t) * eps) / math.sqrt(a_t)
        if clip:
            x0 = x0.clamp(-1, 1)
        eps = (xt - math.sqrt(a_t) * x0) / math.sqrt(1 - a_t)
        sigma = eta * math.sqrt((1 - a_prev) / (1 - a_t)) * math.sqrt(1 - a_t / a_prev)
        out = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev - sigma**2) * eps
        if sigma > 0 and t_prev >= 0:
            out = out + sigma * torch.randn(xt.shape, generator=generator, device=xt.device, dtype=xt.dtype)
        return out
