"""Generation's settings: the engine's, plus the latent space (``--vae``) and the loss weighting
(``--min-snr-gamma``); the recipes (``configs/generation/``) set values for a data set."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Optional

from ..engine.config import TrainConfig, setting
from ..engine.errors import ConfigError
from ..long_range import LongRangeConfig
from .choices import GUIDANCE_MODES, SAMPLERS  # gen sample's, read with these settings by its command line

__all__ = ["GUIDANCE_MODES", "SAMPLERS", "GenerationConfig"]


@dataclass
class GenerationConfig(LongRangeConfig):
    """A class-conditional diffusion run: a WeightFormer-DiT (or DiT) on the bundled MNIST or an ImageFolder tree."""

    data: str = setting("mnist", help="mnist (bundled) or an ImageFolder tree with train/ and val/ (a folder per "
                                      "class in each); its size picks the recipe")
    model: str = setting("wf_dit_s_2", help="the diffusion model: wf_dit_{s,b,l,xl}_{2,4,8} (WeightFormer-DiT), "
                                            "wf_dit_long_range_{s,b,l,xl}_{2,4,8} (its long-range design) or "
                                            "dit_{s,b,l,xl}_{2,4,8} (DiT, attention)")
    # The small-data recipe sizes these two to the folder, so their help says how.
    workers: int = setting(TrainConfig.workers,
                           help="data-loading processes per training process (default: 0 (offline); 4 (dit); "
                                "small-data: 0 up to 2,000 training images, else 4)")
    epochs: int = setting(TrainConfig.epochs,
                          help="length of the schedule in epochs (default: 13 (offline); 80 (dit); small-data: "
                               "enough epochs for about 3,250 steps, 13 to 500)")
    vae: Optional[str] = setting(None, metavar="PATH", help="train in the latent space of the diffusers AutoencoderKL "
                                 "saved in this local folder (e.g. stabilityai/sd-vae-ft-ema); latents are computed "
                                 "once and cached (default: pixel space)")
    min_snr_gamma: Optional[float] = setting(None, metavar="GAMMA",
                                             help="weight the epsilon loss by min(SNR, GAMMA)/SNR, Min-SNR (arXiv "
                                                  "2303.09556), e.g. 1 or 5; none: uniform weights, as DiT")

    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("vae", lambda v: v is None or bool(v), "a local AutoencoderKL folder, or null for pixel space"),
        ("min_snr_gamma", lambda v: v is None or v > 0, "a positive SNR cap such as 5, or null for DiT's uniform "
                                                        "weighting"),
    )

    LONG_RANGE_HINT: ClassVar[str] = "a WeightFormer-DiT (wf_dit_{s,b,l,xl}_{2,4,8})"

    @classmethod
    def long_range_designs(cls) -> Mapping[str, str]:
        from ..models.dit_variants import LONG_RANGE_VARIANTS  # the models: torch

        return LONG_RANGE_VARIANTS

    def check(self) -> None:
        from ..models.dit_variants import DIT_VARIANTS  # imports the models (torch, diffusers): the command line reads this class

        if self.model not in DIT_VARIANTS:
            raise ConfigError(f"model {self.model!r} is not a diffusion model; choose one of {', '.join(DIT_VARIANTS)}")
        super().check()
