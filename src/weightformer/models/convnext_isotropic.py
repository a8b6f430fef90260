"""Isotropic ConvNeXt (Liu et al., 2022), the conv baseline of the ablations, from timm's ``ConvNeXtBlock``: a p×p
patchify stem, ``depth`` blocks at one width and resolution, mean over tokens, LayerNorm, linear head.
"""

from functools import partial

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import LayerNorm2d
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import named_apply, reinit_non_persistent_buffers
from timm.models.convnext import ConvNeXtBlock
from timm.models.vision_transformer import global_pool_nlc, init_weights_reset_parameters
from torch import Tensor, nn

from .weightformer import LinearClassifier, check_global_pool, rewound_rng

__all__ = ["ConvNeXtIsotropic"]

# Every block's layer scale γ starts here (timm's ConvNeXtBlock default, ConvNeXt's 1e-6).
LAYER_SCALE_INIT = 1e-6


class ConvNeXtIsotropic(LinearClassifier, nn.Module):
    """Patchify stem, ``depth`` ConvNeXt blocks at one resolution, pooled linear head (timm API subset).
    ``global_pool``: one of WeightFormer's :data:`~weightformer.models.weightformer.GLOBAL_POOLS`; with "" the
    head normalises and classifies each position of the grid, giving (B, classes, h, w)."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 192, depth: int = 17, kernel_size: int = 7, drop_path_rate: float = 0.0,
                 global_pool: str = "avg", device=None, dtype=None):
        # img_size is accepted (and unused) so that callers that pass it to every model can pass it here too.
        super().__init__()
        check_global_pool(global_pool)
        dd = dict(device=device, dtype=dtype)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.global_pool = global_pool
        with rewound_rng(device):  # init_weights() below draws every value again, as WeightFormer's does
            self.stem = nn.Sequential(nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size, **dd),
                                      LayerNorm2d(embed_dim, **dd))
            rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
            self.blocks = nn.Sequential(*[ConvNeXtBlock(embed_dim, kernel_size=kernel_size, drop_path=r,
                                                        ls_init_value=LAYER_SCALE_INIT, **dd) for r in rates])
            self.norm = nn.LayerNorm(embed_dim, **dd)
            self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=patch_size) for i in range(depth)]
        self.init_weights()

    def init_weights(self, needs_reset: bool = True) -> None:
        """(Re)initialise every parameter and non-persistent buffer (for after ``to_empty()``): ``reset_parameters()``
        on every module (unless ``needs_reset=False``), then each block's layer scale."""
        named_apply(partial(init_weights_reset_parameters, needs_reset=needs_reset), self)
        for block in self.blocks:
            nn.init.constant_(block.gamma, LAYER_SCALE_INIT)
        reinit_non_persistent_buffers(self)

    def forward_features(self, x: Tensor) -> Tensor:  # (B, C_in, H, W) -> (B, C, h, w)
        return self.blocks(self.stem(x))

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """(B, C, h, w) -> (B, classes), or (B, classes, h, w) without pooling (``global_pool=""``)."""
        if self.global_pool:
            if self.global_pool == "avg":  # what global_pool_nlc does, without the transpose (as WeightFormer)
                x = x.mean(dim=(2, 3))  # (B, C)
            else:  # (B, C, h·w) -> (B, h·w, C) -> (B, C)
                x = global_pool_nlc(x.flatten(2).transpose(1, 2), self.global_pool, num_prefix_tokens=0)
            x = self.norm(x)
            return x if pre_logits else self.head(x)
        x = self.norm(x.permute(0, 2, 3, 1))  # (B, h, w, C): the norm and head act on each position
        return (x if pre_logits else self.head(x)).permute(0, 3, 1, 2)

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

    def prune_intermediate_layers(self, indices: int | list[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last one in ``indices`` (and the head's norm and classifier if asked)."""
        take, last = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take


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
    out_indices = kwargs.pop("out_indices", 3)
    return build_model_with_cfg(ConvNeXtIsotropic, "convnext_isotropic_tiny", False,
                                feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **dict(args, **kwargs))
