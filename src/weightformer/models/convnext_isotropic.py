"""Isotropic ConvNeXt (Liu et al., 2022, §"isotropic ConvNeXt"), the conv baseline of the ablations.

timm 1.0 ships only the four-stage ConvNeXt. This is the isotropic layout built from timm's own
``ConvNeXtBlock`` (7×7 depthwise conv, LayerNorm, MLP, layer scale): a p×p patchify stem, ``depth``
blocks at one width and resolution, LayerNorm, mean over tokens and a linear head, the layout of
WeightFormer and DeiT. Registered as ``convnext_isotropic_tiny`` (192-d, 17 blocks, patch 16).
"""


import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import LayerNorm2d
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models.convnext import ConvNeXtBlock
from torch import Tensor, nn

__all__ = ["ConvNeXtIsotropic"]


class ConvNeXtIsotropic(nn.Module):
    """Patchify stem, ``depth`` ConvNeXt blocks at one resolution, pooled linear head (timm API subset)."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 192, depth: int = 17, kernel_size: int = 7, drop_path_rate: float = 0.0,
                 global_pool: str = "avg"):
        # img_size is accepted (and unused) so that callers that pass it to every model can pass it here too.
        super().__init__()
        self.num_classes = num_classes
        self.num_features = self.embed_dim = embed_dim
        self.stem = nn.Sequential(nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size), LayerNorm2d(embed_dim))
        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.Sequential(*[ConvNeXtBlock(embed_dim, kernel_size=kernel_size, drop_path=r) for r in rates])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: Tensor) -> Tensor:  # (B, C_in, H, W) -> (B, C, h, w)
        return self.blocks(self.stem(x))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:  # (B, C, h, w) -> (B, classes)
        x = self.norm(x.mean(dim=(2, 3)))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: Tensor, indices: int | list[int] | None = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False
                              ) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        """Outputs of the chosen blocks (the last n for an int), NCHW."""
        take, last = feature_take_indices(len(self.blocks), indices)
        x = self.stem(x)
        out = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in take:
                out.append(x)
            if stop_early and i >= last:
                break
        return out if intermediates_only else (x, out)


default_cfgs = generate_default_cfgs({
    "convnext_isotropic_tiny": {
        "num_classes": 1000, "input_size": (3, 224, 224), "pool_size": (14, 14), "crop_pct": 0.875,
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "stem.0", "classifier": "head",
    },
})


@register_model
def convnext_isotropic_tiny(pretrained: bool = False, **kwargs) -> ConvNeXtIsotropic:
    """Isotropic ConvNeXt at WeightFormer-T's width and depth (192-d, 17 blocks, patch 16); no weights."""
    if pretrained:
        raise ValueError("convnext_isotropic_tiny has no pretrained weights")
    args = {"patch_size": 16, "embed_dim": 192, "depth": 17}
    return build_model_with_cfg(ConvNeXtIsotropic, "convnext_isotropic_tiny", False, **dict(args, **kwargs))
