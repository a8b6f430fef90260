"""DiT's diffusion: the schedule, the hybrid loss and the reverse steps against direct statements of
the formulas (float64), and the DDIM step against diffusers' DDIMScheduler where their chains coincide."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import DDIMScheduler
from torch.distributions import Normal, kl_divergence

from weightformer.generation.diffusion import GaussianDiffusion, respaced_timesteps

T = 1000


def dit_space_timesteps(num_steps: int, count: int) -> list[int]:
    """DiT's space_timesteps for one section: a float stride, each index rounded, ascending."""
    stride = (num_steps - 1) / (count - 1) if count > 1 else 1
    taken, current = [], 0.0
    for _ in range(count):
        taken.append(round(current))
        current += stride
    return taken


def alphas_cumprod() -> np.ndarray:
    return np.cumprod(1 - np.linspace(1e-4, 0.02, T, dtype=np.float64))


def test_schedule_and_respacing_are_dits():
    diffusion = GaussianDiffusion()
    np.testing.assert_allclose(diffusion.table["alphas_cumprod"].numpy(), alphas_cumprod(), rtol=1e-15)
    for count in (1, 10, 25, 50, 250, 1000):
        assert respaced_timesteps(T, count) == sorted(dit_space_timesteps(T, count), reverse=True)


def test_hybrid_loss_is_mse_plus_kl_to_the_posterior_in_bits():
    diffusion = GaussianDiffusion()
    gen = torch.Generator().manual_seed(1)
    x0 = torch.rand(3, 1, 4, 4, generator=gen, dtype=torch.float64) * 2 - 1
    noise = torch.randn(3, 1, 4, 4, generator=gen, dtype=torch.float64)
    t = torch.tensor([0, 5, 700])
    out = torch.randn(3, 2, 4, 4, generator=gen, dtype=torch.float64)
    out[:, 1].clamp_(-1, 1)
    losses = diffusion.training_losses(lambda xt, tt: out, x0, t, noise)
    a = alphas_cumprod()
    betas = 1 - a / np.append(1.0, a[:-1])
    for i, step in enumerate(t.tolist()):
        a_t, a_prev, beta = a[step], (a[step - 1] if step else 1.0), betas[step]
        xt = np.sqrt(a_t) * x0[i] + np.sqrt(1 - a_t) * noise[i]
        eps = out[i, :1]
        np.testing.assert_allclose(losses["mse"][i].item(), ((noise[i] - eps) ** 2).mean().item(), rtol=1e-12)
        x0_hat = (xt - np.sqrt(1 - a_t) * eps) / np.sqrt(a_t)
        c0, ct = beta * np.sqrt(a_prev) / (1 - a_t), (1 - a_prev) * np.sqrt(1 - beta) / (1 - a_t)
        mean = c0 * x0_hat + ct * xt
        post_var = betas[1:] * (1 - a[:-1]) / (1 - a[1:])  # β̃ for t >= 1
        log_post = np.log(post_var[max(step, 1) - 1])
        frac = (out[i, 1:] + 1) / 2
        log_var = frac * np.log(beta) + (1 - frac) * log_post
        if step == 0:  # decoder NLL: the probability of x0's 1/255-wide bin (edges open) under N(mean, var)
            continue
        true_mean = c0 * x0[i] + ct * xt
        kl = kl_divergence(Normal(true_mean, np.exp(0.5 * log_post)), Normal(mean, torch.exp(0.5 * log_var)))
        np.testing.assert_allclose(losses["vb"][i].item(), kl.mean().item() / np.log(2), rtol=1e-9)
    assert losses["vb"][0] > 0
    torch.testing.assert_close(losses["loss"], losses["mse"] + losses["vb"])


def test_min_snr_weighting_caps_the_signal_to_noise_ratio():
    diffusion = GaussianDiffusion(learn_sigma=False)
    gen = torch.Generator().manual_seed(2)
    x0 = torch.rand(4, 1, 4, 4, generator=gen, dtype=torch.float64) * 2 - 1
    noise = torch.randn(4, 1, 4, 4, generator=gen, dtype=torch.float64)
    out = torch.randn(4, 1, 4, 4, generator=gen, dtype=torch.float64)
    t = torch.tensor([0, 100, 400, 999])
    uniform = diffusion.training_losses(lambda xt, tt: out, x0, t, noise)
    weighted = diffusion.training_losses(lambda xt, tt: out, x0, t, noise, min_snr_gamma=5.0)
    a = alphas_cumprod()[t.numpy()]
    snr = a / (1 - a)
    assert snr[0] > 5 > snr[-1]  # the cap binds at low noise only
    np.testing.assert_allclose(weighted["loss"].numpy(), uniform["mse"].numpy() * np.minimum(snr, 5.0) / snr, rtol=1e-12)
    torch.testing.assert_close(weighted["mse"], uniform["mse"])  # the reported L_simple stays unweighted
    assert weighted["loss"][-1] == uniform["loss"][-1]


def test_ddpm_step_is_dits_respaced_p_sample():
    """diffusers' DDPMScheduler as configured equals DiT's respaced p_sample (learned-range variance)."""
    diffusion = GaussianDiffusion()
    timesteps = respaced_timesteps(T, 10)
    scheduler = diffusion.ddpm_scheduler(timesteps, clip=False)
    a = alphas_cumprod()
    gen = torch.Generator().manual_seed(2)
    for i, t in enumerate(timesteps[:-1]):
        prev = timesteps[i + 1]
        x = torch.randn(2, 3, 4, 4, generator=gen, dtype=torch.float64)
        out = torch.randn(2, 6, 4, 4, generator=gen, dtype=torch.float64)
        out[:, 3:].clamp_(-1, 1)
        ours = scheduler.step(out, t, x, generator=torch.Generator().manual_seed(i)).prev_sample
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64)
        beta = 1 - a[t] / a[prev]  # the respaced β
        post_var = beta * (1 - a[prev]) / (1 - a[t])
        x0 = np.sqrt(1 / a[t]) * x - np.sqrt(1 / a[t] - 1) * out[:, :3]
        mean = beta * np.sqrt(a[prev]) / (1 - a[t]) * x0 + (1 - a[prev]) * np.sqrt(1 - beta) / (1 - a[t]) * x
        frac = (out[:, 3:] + 1) / 2
        log_var = frac * np.log(beta) + (1 - frac) * np.log(post_var)
        torch.testing.assert_close(ours, mean + torch.exp(0.5 * log_var) * noise, rtol=1e-10, atol=1e-10)


def test_ddim_step_matches_diffusers_where_the_chains_coincide():
    """With K dividing 1000 and steps 900, 800, ..., 0, diffusers' DDIM chain is DiT's DDIM on those steps."""
    diffusion = GaussianDiffusion()
    reference = DDIMScheduler(num_train_timesteps=T, beta_schedule="linear", beta_start=1e-4, beta_end=0.02,
                              clip_sample=True, set_alpha_to_one=True, timestep_spacing="leading")
    reference.set_timesteps(10)
    reference.alphas_cumprod = torch.from_numpy(alphas_cumprod())
    steps = reference.timesteps.tolist()
    gen = torch.Generator().manual_seed(3)
    for i, t in enumerate(steps):
        x = torch.randn(2, 3, 4, 4, generator=gen, dtype=torch.float64)
        eps = torch.randn(2, 3, 4, 4, generator=gen, dtype=torch.float64) * 3  # large: the x0 clip matters
        expected = reference.step(eps, t, x, eta=0.0, use_clipped_model_output=True).prev_sample
        ours = diffusion.ddim_step(eps, x, t, steps[i + 1] if i + 1 < len(steps) else -1, clip=True)
        torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)


class _PosteriorMeanDenoiser(torch.nn.Module):
    """The exact ε-predictor of a finite image set: x̂0 = E[x0 | x_t] under q, restricted to the images of
    the requested class (all images for the null label). It shares nothing with the model or sampler's
    code. Being exact, it snaps a chain back onto the set at the end even if a step's coefficients are a
    little off (those are tested against DiT's formulas above); what it checks is the wiring: timestep
    order, labels and the null label in guidance, the guided half, the generator."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, num_classes: int):
        super().__init__()
        self.images, self.labels = images, labels  # (M, C, H, W) in [-1, 1], (M,)
        self.num_classes, self.in_channels, self.input_size, self.learn_sigma = num_classes, images.shape[1], images.shape[-1], False
        self.anchor = torch.nn.Parameter(torch.zeros((), dtype=torch.float64))  # sets the sampler's dtype
        betas = np.linspace(1e-4, 0.02, 1000)
        self.acp = torch.from_numpy(np.cumprod(1 - betas))

    def forward(self, xt, t, y):
        a = self.acp[t].view(-1, 1, 1)  # (B, 1, 1)
        ref = self.images.flatten(1)[None]  # (1, M, D)
        logits = -(xt.flatten(1)[:, None] - a.sqrt() * ref).pow(2).sum(-1) / (2 * (1 - a[..., 0]))  # (B, M)
        allowed = (y[:, None] == self.labels[None]) | (y[:, None] == self.num_classes)
        x0 = (torch.softmax(logits.masked_fill(~allowed, -torch.inf), -1) @ self.images.flatten(1)).view_as(xt)
        a = a.view(-1, 1, 1, 1)
        return (xt - a.sqrt() * x0) / (1 - a).sqrt()

    def forward_with_cfg(self, x, t, y, cfg_scale, guidance=None):
        half = len(x) // 2
        cond, uncond = self.forward(torch.cat([x[:half], x[:half]]), t, y).split(half)
        guided = uncond + cfg_scale * (cond - uncond)
        return torch.cat([guided, guided])


def test_sampling_with_the_exact_denoiser_lands_on_the_requested_class():
    """The sampler's end-to-end check (docs/generation.md: the offline job's weak samples are the
    model's, not the sampler's). DDPM and DDIM, with and without guidance: with the posterior-mean denoiser of 12 binary images
    (4 classes of 3), every sample ends next to one of its class's images, the nearest images of the
    samples of a class spread over that class, and a fixed generator repeats the samples."""
    from weightformer.generation.sampling import sample

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 2, (12, 1, 6, 6), generator=g).double() * 2 - 1
    labels = torch.arange(4).repeat_interleave(3)
    oracle = _PosteriorMeanDenoiser(images, labels, num_classes=4)
    wanted = torch.arange(4).repeat_interleave(8)
    diffusion = GaussianDiffusion(learn_sigma=False)
    for sampler, steps, cfg in (("ddpm", 100, 1.0), ("ddpm", 50, 4.0), ("ddim", 25, 1.0), ("ddim", 25, 4.0)):
        x = sample(oracle, diffusion, wanted, steps, sampler, cfg, generator=torch.Generator().manual_seed(1))
        distance = torch.cdist(x.flatten(1), images.flatten(1))  # (32, 12)
        nearest = distance.argmin(1)
        assert (labels[nearest] == wanted).all(), (sampler, steps, cfg)
        assert distance.min(1).values.max() < 0.5, (sampler, steps, cfg, distance.min(1).values.max())  # of 6 per image
        assert len(set(nearest.tolist())) >= 8, (sampler, steps, cfg)  # not one image per class
        again = sample(oracle, diffusion, wanted, steps, sampler, cfg, generator=torch.Generator().manual_seed(1))
        assert torch.equal(x, again)
