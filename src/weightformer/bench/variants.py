"""The models a benchmark compares: WeightFormer (fast, naive, checkpointed) against timm's DeiT.

A variant is a timm model name plus the switches that distinguish it (dynamic-layer implementation,
fused or explicit attention, gradient checkpointing) and the baseline its ratios are taken against.
The table of variants needs no torch (the CLI's help lists it); building one imports torch and timm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import torch
    from torch import nn

INFER = "infer"
TRAIN = "train"


@dataclass(frozen=True)
class Variant:
    """One benchmarked model: how to build it, which modes it runs in, and its baseline."""

    key: str
    label: str
    timm_name: str
    family: str
    baseline: str
    implementation: Optional[str] = None  # WeightFormer only: "fast" or "reference"
    fused_attn: Optional[bool] = None  # DeiT only
    grad_checkpointing: bool = False
    # Checkpointing changes nothing in inference, so checkpointed variants are measured training only.
    modes: Tuple[str, ...] = field(default=(INFER, TRAIN))

    @property
    def is_vit(self) -> bool:
        return self.fused_attn is not None


def _family(size: str, wf: str, deit: str) -> List[Variant]:
    base = f"deit-{size}"
    return [
        Variant(f"wf-{size}", f"WeightFormer-{size.upper()}", wf, size, base, implementation="fast"),
        Variant(f"wf-{size}-naive", f"WeightFormer-{size.upper()} naive", wf, size, base, implementation="reference"),
        Variant(
            f"wf-{size}-ckpt",
            f"WeightFormer-{size.upper()} grad-ckpt",
            wf,
            size,
            base,
            implementation="fast",
            grad_checkpointing=True,
            modes=(TRAIN,),
        ),
        Variant(base, f"DeiT-{size.upper()} fused attn", deit, size, base, fused_attn=True),
        Variant(f"deit-{size}-explicit", f"DeiT-{size.upper()} explicit attn", deit, size, base, fused_attn=False),
    ]


VARIANTS: Dict[str, Variant] = {
    v.key: v
    for v in _family("t", "weightformer_tiny", "deit_tiny_patch16_224")
    + _family("s", "weightformer_small", "deit_small_patch16_224")
}


def get_variant(key: str) -> Variant:
    """Look a variant up by key, with an error that lists the valid keys."""
    if key not in VARIANTS:
        raise ValueError(f"unknown model {key!r}; choose from {', '.join(VARIANTS)}")
    return VARIANTS[key]


def build_variant(variant: Variant, resolution: int, device: str = "cpu") -> nn.Module:
    """Create ``variant`` for ``resolution``² inputs on ``device``, fp32, randomly initialised."""
    import timm

    import weightformer.models  # noqa: F401  (registers the WeightFormer models with timm)

    kwargs = {"num_classes": 1000, "device": device}
    if variant.is_vit:
        # DeiT's position embedding is sized for ``img_size``; dynamic_img_size also admits smaller warm-up inputs.
        kwargs.update(img_size=resolution, dynamic_img_size=True)
    model = timm.create_model(variant.timm_name, **kwargs)
    if variant.implementation is not None:
        model.set_implementation(variant.implementation)
    if variant.fused_attn is not None:
        for module in model.modules():
            if hasattr(module, "fused_attn"):
                module.fused_attn = variant.fused_attn
    model.set_grad_checkpointing(variant.grad_checkpointing)
    return model


def param_count(model: nn.Module) -> int:
    """Number of parameters (each counted once)."""
    return sum(p.numel() for p in model.parameters())


def random_batch(batch: int, resolution: int, device: str, num_classes: int = 1000) -> Tuple[torch.Tensor, torch.Tensor]:
    """A random image batch (B, 3, R, R) and random labels (B,) on ``device``."""
    import torch

    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, resolution, resolution, generator=gen).to(device)
    labels = torch.randint(0, num_classes, (batch,), generator=gen).to(device)
    return images, labels
