"""WeightFormer-DiT: DiT (Peebles and Xie, 2023) with WeightFormer blocks in place of attention, and the
attention DiT in the same code. The block is the authors' release (``model/wfm_dit.py`` in
LeapLabTHU/WeightFormer), unlike the classifier's: every block first sets ``x = LN(x)`` (affine-free); adaLN-Zero
gives each branch a shift, scale and gate from ``c = t_emb + y_emb``; the mixer is a gated 3×3 depthwise conv,
``x = x + g₁ ⊙ DWC(LN(x)·(1 + s₁) + b₁)``, and the tanh-GELU MLP reads ``modulate(LN(x))``, as in DiT. Blocks
1, 4, 7, ... use :class:`~weightformer.layers.DynamicDWConv` and a :class:`~weightformer.layers.DynamicLinear`
first MLP layer (the release's ``DynCnn`` and ``DynLinear``); :func:`checkpoint_filter_fn` reads its state dicts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch
from diffusers.models.embeddings import get_2d_sincos_pos_embed, get_timestep_embedding
from timm.layers import Attention, Mlp, PatchEmbed, trunc_normal_
from torch import Tensor, nn

from ..layers import DynamicDWConv, DynamicLinear
from ..layers.dynamic_dwconv import check_dwc_padding, static_depthwise_conv
from ..layers.gelu_linear import gelu_linear
from ..layers.inference import eager_inference, hookless, tokens_per_chunk
from ..generation.choices import GUIDANCE_MODES  # torch-free: gen sample's command line lists them
from .weightformer import dynamic_conv_blocks, dynamic_linear_blocks

__all__ = ["GUIDANCE_MODES", "DiTBlock", "WeightFormerDiT", "WeightFormerDiTBlock", "checkpoint_filter_fn"]

FREQUENCY_EMBEDDING_SIZE = 256  # DiT's timestep frequency embedding width
RELEASE_GUIDED_CHANNELS = 3  # the release (and DiT) guide output channels [0, 3) "for exact reproducibility"
BLOCK_INITS = ("dit", "vit")  # the blocks' linear layers: DiT's Xavier-uniform, or timm's ViT truncated normal
_tanh_gelu = partial(nn.GELU, approximate="tanh")


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """adaLN: x·(1 + scale) + shift, with (B, C) conditioning broadcast over the tokens of x (B, N, C)."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class TimestepEmbedder(nn.Module):
    """t (B,) -> (B, D): DiT's sinusoidal frequencies (cos half first, max period 10000), then a SiLU MLP."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQUENCY_EMBEDDING_SIZE, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))

    def forward(self, t: Tensor) -> Tensor:
        # diffusers' embedding with flip_sin_to_cos and no frequency shift is DiT's exactly
        freq = get_timestep_embedding(t, FREQUENCY_EMBEDDING_SIZE, flip_sin_to_cos=True, downscale_freq_shift=0)
        return self.mlp(freq.to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class labels -> (B, D), with label dropout for classifier-free guidance: row ``num_classes`` is
    the null label, used for a training label with probability ``dropout_prob`` or where ``force_drop``."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), hidden_size)
        self.num_classes, self.dropout_prob = num_classes, dropout_prob

    def forward(self, labels: Tensor, train: bool, force_drop: Tensor | None = None) -> Tensor:
        if force_drop is not None:
            labels = torch.where(force_drop.bool(), self.num_classes, labels)
        elif train and self.dropout_prob > 0:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
            labels = torch.where(drop, self.num_classes, labels)
        return self.embedding_table(labels)


class WeightFormerDiTBlock(nn.Module):
    """The release's block: x = LN(x); x += g₁·DWC(mod(x)); x += g₂·MLP(mod(LN(x))); see the module docstring."""

    def __init__(self, hidden_size: int, mlp_ratio: float, grid: tuple[int, int], dynamic: bool,
                 linear_predictor: str = "bilateral", dynamic_dwc: bool | None = None, dwc_predictor: str = "adaptive",
                 dwc_static_led: bool = False, dwc_padding: str = "zeros"):
        """``dynamic_dwc`` (None: ``dynamic``) chooses the conv apart from the MLP, as in the classifier's block;
        ``dwc_predictor``, ``dwc_static_led`` and ``dwc_padding`` are :class:`DynamicDWConv`'s ``predictor``,
        ``static_led`` and ``padding`` (a static conv padded with the background: :class:`BackgroundPaddedConv2d`)."""
        super().__init__()
        hidden = int(hidden_size * mlp_ratio)
        self.grid, self.dynamic = grid, dynamic
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        dynamic_dwc = dynamic if dynamic_dwc is None else dynamic_dwc
        if dynamic_dwc:
            self.dwc = DynamicDWConv(hidden_size, 3, predictor=dwc_predictor, static_led=dwc_static_led,
                                     padding=dwc_padding)
        else:
            self.dwc = static_depthwise_conv(hidden_size, 3, dwc_padding)
        if dynamic:
            self.linear1 = DynamicLinear(hidden_size, hidden, predictor=linear_predictor)
        else:
            self.linear1 = nn.Linear(hidden_size, hidden)
        self.act = _tanh_gelu()
        self.linear2 = nn.Linear(hidden, hidden_size)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:  # x (B, N, C), c (B, C)
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        (B, N, C), (H, W) = x.shape, self.grid
        x = self.norm1(x)
        mixed = modulate(x, shift1, scale1).reshape(B, H, W, C).permute(0, 3, 1, 2)  # (B, C, H, W), channels-last
        x = x + gate1.unsqueeze(1) * self.dwc(mixed).flatten(2).transpose(1, 2)  # (B, N, C)
        h = modulate(self.norm2(x), shift2, scale2)
        h = self.linear1(h.reshape(B, H, W, C)).reshape(B, N, -1) if self.dynamic else self.linear1(h)
        return x + gate2.unsqueeze(1) * self._act_linear2(h)

    def _act_linear2(self, h: Tensor) -> Tensor:
        """linear2(act(h)); for stock modules one op that keeps only h for backward (:func:`gelu_linear`)."""
        act, linear2 = self.act, self.linear2
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
            if type(act) is nn.GELU and type(linear2) is nn.Linear and hookless(act, linear2):
                return gelu_linear(h, linear2.weight, linear2.bias, approximate=act.approximate)
        return linear2(act(h))

    def can_run_in_place(self) -> bool:
        """Whether :meth:`forward_in_place_` is ``forward``: stock modules, fast-path dynamic layers, no hooks."""
        m = self._modules
        norm1, norm2, dwc, linear1, act, linear2 = m["norm1"], m["norm2"], m["dwc"], m["linear1"], m["act"], m["linear2"]
        return (
            type(norm1) is nn.LayerNorm and type(norm2) is nn.LayerNorm
            and (type(dwc) is nn.Conv2d or (type(dwc) is DynamicDWConv and not dwc.use_reference))
            and (type(linear1) is nn.Linear or (type(linear1) is DynamicLinear and not linear1.use_reference))
            and type(act) is nn.GELU and type(linear2) is nn.Linear
            and hookless(self, norm1, norm2, dwc, linear1, act, linear2)
        )

    def forward_in_place_(self, x: Tensor, c: Tensor) -> None:
        """``x = self(x, c)`` in place, without gradients, for a contiguous x (B, N, C) the caller owns, chunk by
        chunk of tokens: holds x, the modulated stream and the conv's output at most."""
        shift1, scale1, gate1, shift2, scale2, gate2 = (m.unsqueeze(1) for m in self.adaLN_modulation(c).chunk(6, dim=1))
        (B, N, C), (H, W) = x.shape, self.grid
        step = tokens_per_chunk(N, self.linear2.in_features, x.element_size(), N)
        for start in range(0, N, step):
            chunk = x[:, start:start + step]
            chunk.copy_(self.norm1(chunk))
        mixed = (x * (1 + scale1)).add_(shift1).view(B, H, W, C).permute(0, 3, 1, 2)  # (B, C, H, W), channels-last
        mixer_out = self.dwc(mixed).flatten(2).transpose(1, 2)  # (B, N, C)
        del mixed
        x += mixer_out.mul_(gate1)
        del mixer_out
        approximate, linear1, linear2 = self.act.approximate, self.linear1, self.linear2
        if self.dynamic:
            h = (self.norm2(x) * (1 + scale2)).add_(shift2)  # (B, N, C): the predictor pools the whole grid
            weight_t = linear1.dynamic_weight(h.view(B, H, W, C)).transpose(1, 2)  # (B, C, hidden)
        for start in range(0, N, step):
            if self.dynamic:
                hidden = torch.baddbmm(linear1.bias, h[:, start:start + step], weight_t)  # (B, step, hidden)
            else:
                hidden = linear1(self.norm2(x[:, start:start + step]).mul_(1 + scale2).add_(shift2))
            out = gelu_linear(hidden, linear2.weight, linear2.bias, consume=True, approximate=approximate)
            chunk = x[:, start:start + step]  # a view: += writes into x
            chunk += out.mul_(gate2)


class DiTBlock(nn.Module):
    """DiT's block: x += g₁·Attn(mod(LN(x))); x += g₂·MLP(mod(LN(x))), timm's ``Attention``, DiT's key names."""

    def __init__(self, hidden_size: int, mlp_ratio: float, num_heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio), act_layer=_tanh_gelu)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:  # x (B, N, C), c (B, C)
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate1.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift2, scale2))


class FinalLayer(nn.Module):
    """adaLN (shift, scale) over an affine-free LayerNorm, then a linear map to p·p·out_channels per token."""

    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))

    def forward_in_place_(self, x: Tensor, c: Tensor, step: int) -> Tensor:
        """``self(x, c)`` without gradients, overwriting x (B, N, C) ``step`` tokens at a time -> (B, N, p·p·out)."""
        shift, scale = (m.unsqueeze(1) for m in self.adaLN_modulation(c).chunk(2, dim=1))
        for start in range(0, x.shape[1], step):
            chunk = x[:, start:start + step]
            chunk.copy_(self.norm_final(chunk).mul_(1 + scale).add_(shift))
        return self.linear(x)


class WeightFormerDiT(nn.Module):
    """Class-conditional DiT with DiT's constructor and interface (``mixer="attention"``: DiT itself). As for the
    classifier, ``linear_predictor``, ``dynamic_period``, ``dwc_dynamic_period`` and ``dynamic_linear_start`` choose
    the dynamic MLP predictor, the dynamic blocks, those of them whose conv is dynamic and the first whose MLP is,
    ``dwc_predictor``, ``dwc_static_led`` and ``dwc_padding`` the dynamic convs' predictor, start and padding;
    ``block_init`` how the blocks' mixer and MLP linear layers are drawn (:meth:`initialize_weights`)."""

    def __init__(self, input_size: int = 32, patch_size: int = 2, in_channels: int = 4, hidden_size: int = 1152,
                 depth: int = 28, mlp_ratio: float = 4.0, class_dropout_prob: float = 0.1, num_classes: int = 1000,
                 learn_sigma: bool = True, mixer: str = "weightformer", num_heads: int = 16,
                 guidance: str = "release", linear_predictor: str = "bilateral", dynamic_period: int = 3,
                 block_init: str = "dit", dwc_dynamic_period: int | None = None, dynamic_linear_start: int = 0,
                 dwc_predictor: str = "adaptive", dwc_static_led: bool = False, dwc_padding: str = "zeros"):
        super().__init__()
        check_dwc_padding(dwc_padding)
        if mixer not in ("weightformer", "attention"):
            raise ValueError(f"mixer must be 'weightformer' or 'attention', got {mixer!r}")
        if guidance not in GUIDANCE_MODES:
            raise ValueError(f"guidance must be one of {GUIDANCE_MODES}, got {guidance!r}")
        if mixer == "attention" and (linear_predictor, dynamic_period, dwc_dynamic_period, dynamic_linear_start,
                                     dwc_predictor, dwc_static_led, dwc_padding) != (
                                         "bilateral", 3, None, 0, "adaptive", False, "zeros"):
            raise ValueError("linear_predictor, dynamic_period, dwc_dynamic_period, dynamic_linear_start, "
                             "dwc_predictor, dwc_static_led and dwc_padding choose WeightFormer blocks; the attention "
                             "DiT has none")
        convs = dynamic_conv_blocks(dwc_dynamic_period, dynamic_period, depth)
        linears = dynamic_linear_blocks(dynamic_linear_start, dynamic_period, depth)
        if input_size % patch_size:
            raise ValueError(f"input_size {input_size} is not a multiple of patch_size {patch_size}")
        if block_init not in BLOCK_INITS:
            raise ValueError(f"block_init must be one of {BLOCK_INITS}, got {block_init!r}")
        self.block_init = block_init
        self.input_size, self.patch_size, self.in_channels = input_size, patch_size, in_channels
        self.learn_sigma, self.out_channels = learn_sigma, in_channels * 2 if learn_sigma else in_channels
        self.num_classes, self.mixer, self.guidance = num_classes, mixer, guidance
        side = input_size // patch_size
        self.grid = (side, side)
        self.x_embedder = PatchEmbed(input_size, patch_size, in_channels, hidden_size, bias=True)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size, class_dropout_prob)
        pos = get_2d_sincos_pos_embed(hidden_size, side, base_size=side, output_type="pt")  # (N, D), DiT's layout
        self.register_buffer("pos_embed", pos.float().unsqueeze(0))  # (1, N, D), fixed
        if mixer == "weightformer":
            blocks = [WeightFormerDiTBlock(hidden_size, mlp_ratio, self.grid, linears[i], linear_predictor, convs[i],
                                           dwc_predictor, dwc_static_led, dwc_padding) for i in range(depth)]
        else:
            blocks = [DiTBlock(hidden_size, mlp_ratio, num_heads) for _ in range(depth)]
        self.blocks = nn.ModuleList(blocks)
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        """DiT's: Xavier-uniform linear layers and patch embedding, N(0, 0.02) label table and timestep MLP, zeroed
        adaLN and output layers (adaLN-Zero); the dynamic layers keep their own draws (the release's truncated normal;
        nn.Conv2d's for a static-led conv).
        ``block_init="vit"`` draws the blocks' mixer and MLP linear layers (attention's qkv and proj, the MLP's
        two layers) from timm's ViT init instead, a truncated normal of std 0.02 as timm's DeiT: about 4x
        smaller than Xavier at width 64, so the first optimizer steps, not the draw, set the weights
        (docs/generation.md: the attention DiT's score at the offline job's length follows its blocks' draw)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.block_init == "vit":
            for block in self.blocks:
                for name, module in block.named_modules():
                    if type(module) is nn.Linear and not name.startswith("adaLN") and ".predictor." not in f".{name}":
                        trunc_normal_(module.weight, std=0.02)
        w = self.x_embedder.proj.weight
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        nn.init.zeros_(self.x_embedder.proj.bias)
        for module in (self.y_embedder.embedding_table, self.t_embedder.mlp[0], self.t_embedder.mlp[2]):
            nn.init.normal_(module.weight, std=0.02)
        for layer in [*(b.adaLN_modulation[-1] for b in self.blocks), self.final_layer.adaLN_modulation[-1],
                      self.final_layer.linear]:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def unpatchify(self, x: Tensor) -> Tensor:  # (B, N, p·p·C) -> (B, C, H, W)
        (h, w), p, c = self.grid, self.patch_size, self.out_channels
        x = x.reshape(x.shape[0], h, w, p, p, c)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x: Tensor, t: Tensor, y: Tensor, force_drop: Tensor | None = None) -> Tensor:
        """x (B, in_channels, H, W), t (B,) timesteps, y (B,) labels (``num_classes`` is the null label)
        -> (B, out_channels, H, W). ``force_drop`` (B,) replaces the marked labels by the null label."""
        embedded = self.x_embedder(x)  # (B, N, D)
        c = self.t_embedder(t) + self.y_embedder(y, self.training, force_drop)  # (B, D)
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
            if eager_inference() and all(type(b) is WeightFormerDiTBlock and b.can_run_in_place() for b in self.blocks):
                # The model owns its token stream, so each block may update it in place (see forward_in_place_).
                tokens = torch.empty_like(embedded, memory_format=torch.contiguous_format)
                torch.add(embedded, self.pos_embed, out=tokens)
                del embedded
                for block in self.blocks:
                    block.forward_in_place_(tokens, c)
                final = self.final_layer
                if type(final.norm_final) is nn.LayerNorm and type(final.linear) is nn.Linear and hookless(
                        final, final.norm_final, final.linear):
                    N = tokens.shape[1]
                    step = tokens_per_chunk(N, tokens.shape[-1], tokens.element_size(), N)
                    return self.unpatchify(final.forward_in_place_(tokens, c, step))
                return self.unpatchify(final(tokens, c))
        tokens = embedded + self.pos_embed
        for block in self.blocks:
            tokens = block(tokens, c)
        return self.unpatchify(self.final_layer(tokens, c))

    def forward_with_cfg(self, x: Tensor, t: Tensor, y: Tensor, cfg_scale: float,
                         guidance: str | None = None) -> Tensor:
        """DiT's batched guidance, ε_u + s·(ε_c − ε_u), over [conditional; unconditional] halves (x's first half for
        both). ``guidance`` (default: the model's) ``"release"`` guides output channels [0, 3) as DiT does,
        ``"standard"`` the ``in_channels`` noise channels."""
        mode = guidance or self.guidance
        if mode not in GUIDANCE_MODES:
            raise ValueError(f"guidance must be one of {GUIDANCE_MODES}, got {mode!r}")
        half = x[: len(x) // 2]
        out = self.forward(torch.cat([half, half]), t, y)
        guided = RELEASE_GUIDED_CHANNELS if mode == "release" else self.in_channels
        eps, rest = out[:, :guided], out[:, guided:]
        cond, uncond = eps.split(len(eps) // 2)
        half_eps = uncond + cfg_scale * (cond - uncond)
        return torch.cat([torch.cat([half_eps, half_eps]), rest], dim=1)


# The release's names of the dynamic layers' parameters -> ours (the static DynLinear weight is (C, O) there).
_RELEASE_RENAMES = tuple((rf"(blocks\.\d+\.{layer})\.{old}", rf"\1.{new}") for layer, old, new in (
    ("linear1", "w$", "weight"), ("linear1", "b$", "bias"), ("linear1", r"wfm\.", "predictor.proj."),
    ("linear1", "w1$", "predictor.in_basis"), ("linear1", "w2$", "predictor.out_basis"), ("dwc", "w$", "weight"),
    ("dwc", "b$", "bias"), ("dwc", r"wfm\.0\.", "predictor.fc1."), ("dwc", r"wfm\.2\.", "predictor.fc2.")))


def checkpoint_filter_fn(state_dict: Mapping[str, Tensor], model: WeightFormerDiT | None = None) -> dict[str, Tensor]:
    """A state dict of the release's ``model/wfm_dit.py`` (or one of ours, unchanged) as :class:`WeightFormerDiT`
    keys; ``model`` is unused (timm's filter contract). Of DiT's training checkpoints pass ``"ema"`` or ``"model"``."""
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        key = key.removeprefix("module.")
        for pattern, repl in _RELEASE_RENAMES:
            new = re.sub(pattern, repl, key)
            if new != key:
                if repl.endswith(".weight") and "linear1" in key and value.dim() == 2:
                    value = value.t()  # DynLinear.w is (in, out); DynamicLinear.weight is (out, in)
                key = new
                break
        out[key] = value
    return out


def load_release_state_dict(model: WeightFormerDiT, state_dict: Mapping[str, Any]) -> None:
    """Load a release (or DiT training) checkpoint into ``model``, strictly: its ``ema``, else ``model``, or itself."""
    for entry in ("ema", "model"):
        if isinstance(state_dict.get(entry), Mapping):
            state_dict = state_dict[entry]
            break
    model.load_state_dict(checkpoint_filter_fn(state_dict, model), strict=True)
