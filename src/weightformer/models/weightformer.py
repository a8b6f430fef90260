"""WeightFormer: an isotropic vision backbone with dynamic weights in place of attention.

Layout, as released by the authors (He, Han and Huang, arXiv 2605.01711):

    image -> PatchEmbed (16×16) -> LayerNorm -> 17 blocks -> LayerNorm -> mean over tokens -> Linear

No class token, no position embedding. Block i is dynamic when (i + 2) % period == 0 (period 3:
blocks 1, 4, 7, ...). Tokens stay on their grid, (B, H, W, C), from the patch embedding to the head.
"""

from contextlib import contextmanager
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, PatchEmbed, get_device_dtype, nchw_to, to_2tuple
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models import register_notrace_function, register_notrace_module
from timm.models._features import feature_take_indices
from timm.models._input import update_model_input_size
from timm.models._manipulate import checkpoint, named_apply, reinit_non_persistent_buffers
from timm.models.vision_transformer import global_pool_nlc, init_weights_vit_timm

from ..checkpoint import release_pickle_globals, strip_wrapper_prefixes
from ..layers import DynamicDWConv, DynamicLinear
from ..layers.dynamic_dwconv import check_dwc_padding, static_depthwise_conv
from ..layers.gelu_linear import gelu_linear
from ..layers.inference import eager_inference, hookless, tokens_per_chunk

__all__ = ["GLOBAL_POOLS", "WeightFormer", "Block", "checkpoint_filter_fn", "dynamic_conv_blocks",
           "dynamic_linear_blocks", "is_dynamic_block"]

# timm's global pools for a grid of tokens without a class token (``global_pool_nlc``); "" keeps the grid.
GLOBAL_POOLS = ("avg", "max", "avgmax", "")

# The dynamic layers read the token grid from their input's shape, which fx cannot trace through.
register_notrace_module(DynamicLinear)
register_notrace_module(DynamicDWConv)


def is_dynamic_block(index: int, period: int) -> bool:
    """Whether block ``index`` is dynamic: (index + 2) % period == 0, i.e. 1, 4, 7, ... for period 3;
    ``period`` 1 makes every block dynamic and 0 none."""
    return period > 0 and (index + 2) % period == 0


def dynamic_conv_blocks(dwc_period: Optional[int], period: int, depth: int) -> List[bool]:
    """Whether each of ``depth`` blocks has a dynamic depthwise conv: the blocks ``dwc_period`` names as
    ``dynamic_period`` names the dynamic ones (None: the dynamic blocks). Raises ``ValueError`` for a period that
    is not an int >= 0 or that names a static block."""
    if dwc_period is None:
        return [is_dynamic_block(i, period) for i in range(depth)]
    if isinstance(dwc_period, bool) or not isinstance(dwc_period, int) or dwc_period < 0:
        raise ValueError(f"dwc_dynamic_period must be an int >= 0 (0: every conv static) or None (the dynamic "
                         f"blocks' convs), got {dwc_period!r}")
    convs = [is_dynamic_block(i, dwc_period) for i in range(depth)]
    if any(conv and not is_dynamic_block(i, period) for i, conv in enumerate(convs)):
        raise ValueError(f"dwc_dynamic_period={dwc_period} makes the conv of a static block dynamic "
                         f"(dynamic_period={period}); choose a multiple of dynamic_period, or 0")
    return convs


def dynamic_linear_blocks(start: int, period: int, depth: int) -> List[bool]:
    """Whether each of ``depth`` blocks has a dynamic MLP (fc1): the dynamic blocks from index ``start`` on. Raises
    ``ValueError`` for a ``start`` that is not a block index from 0 to ``depth``."""
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= depth:
        raise ValueError(f"dynamic_linear_start must be a block index from 0 (every dynamic block's MLP dynamic) "
                         f"to depth={depth} (none), got {start!r}")
    return [is_dynamic_block(i, period) and i >= start for i in range(depth)]


@register_notrace_function
def check_image_batch(x: Tensor, in_chans: int, patch_size: int) -> None:
    """Raise ``ValueError`` unless x is a (B, in_chans, H, W) batch with H, W >= patch_size."""
    if x.dim() != 4:
        raise ValueError(f"expected an image batch of shape (B, C, H, W), got a tensor of shape {x.shape}")
    if x.shape[1] != in_chans:
        raise ValueError(f"expected {in_chans} input channels, got {x.shape[1]} (input shape {x.shape}); "
                         f"convert the images or build the model with in_chans={x.shape[1]}")
    if x.shape[2] < patch_size or x.shape[3] < patch_size:
        raise ValueError(f"image of {x.shape[2]}x{x.shape[3]} pixels is smaller than one {patch_size}x{patch_size} "
                         f"patch; resize it to at least {patch_size}x{patch_size}")


@register_notrace_function
def whole_patches(x: Tensor, patch_size: int) -> Tensor:
    """Crop (B, C, H, W) to (B, C, H - H % p, W - W % p), p = ``patch_size``, dropping the pixels past the last
    whole patch as the release's stride-p patch convolution does (232 px give 14×14 tokens)."""
    H, W = x.shape[-2], x.shape[-1]
    return x[:, :, : H - H % patch_size, : W - W % patch_size]


@register_notrace_function
def pad_to_whole_patches(x: Tensor, patch_size: int) -> Tensor:
    """Zero-pad (B, C, H, W) at the bottom and right to (B, C, ⌈H/p⌉·p, ⌈W/p⌉·p), p = ``patch_size``, as
    timm's ``PatchEmbed(dynamic_img_pad=True)`` does: the last partial patch is kept instead of dropped."""
    H, W = x.shape[-2], x.shape[-1]
    return F.pad(x, (0, (patch_size - W % patch_size) % patch_size, 0, (patch_size - H % patch_size) % patch_size))


def check_global_pool(global_pool: str) -> None:
    """Raise ``ValueError`` unless ``global_pool`` is one of :data:`GLOBAL_POOLS`."""
    if global_pool in GLOBAL_POOLS:
        return
    if global_pool == "token":
        raise ValueError("global_pool='token' needs a class token, and these models have none; "
                         f"use one of {GLOBAL_POOLS} ('' keeps the token grid)")
    raise ValueError(f"global_pool must be one of {GLOBAL_POOLS} ('' keeps the token grid), got {global_pool!r}")


@contextmanager
def rewound_rng(device: Optional[Union[str, torch.device]]) -> Iterator[None]:
    """Put the generator of ``device`` (None: the default device) back where it stood when the block started:
    modules built inside it and then ``init_weights()`` hold the values of a meta build + ``to_empty()`` +
    ``init_weights()`` from the same generator state."""
    where = torch.empty(0, device=device).device  # resolves None to the default device (torch.device contexts too)
    if where.type == "meta":  # nothing is drawn on the meta device
        yield
        return
    accelerators = [] if where.type == "cpu" else [where.index]  # a tensor's device has its index
    with torch.random.fork_rng(devices=accelerators, device_type="cuda" if where.type == "cpu" else where.type):
        yield


class WholePatchEmbed(PatchEmbed):
    """timm's ``PatchEmbed`` (same keys) without its divisibility check, which makes torch.compile specialise on
    a symbolic size; the images are already cut to whole patches (:func:`whole_patches`)."""

    def forward(self, x: Tensor) -> Tensor:  # (B, C_in, H, W) -> (B, H / p, W / p, C), NHWC
        return self.norm(nchw_to(self.proj(x), self.output_fmt))


class Mlp(nn.Module):
    """Token MLP on a grid, (B, H, W, C) -> (B, H, W, C): fc1 (static or dynamic), GELU, fc2. GELU + fc2 run as
    one op (layers.gelu_linear) whenever that is exactly equivalent, checked at every call;
    ``fuse_act_fc2 = False`` turns it off."""

    def __init__(self, fc1: nn.Module, hidden: int, dim: int, act_layer: Callable[..., nn.Module], drop: float, dd):
        super().__init__()
        self.fc1 = fc1
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim, **dd)
        self.drop2 = nn.Dropout(drop)
        self.fuse_act_fc2 = True

    def _can_fuse_act_fc2(self) -> bool:
        modules = self._modules  # plain dict lookups, cheaper than nn.Module.__getattr__
        act, drop1, fc2 = modules["act"], modules["drop1"], modules["fc2"]
        return (
            type(act) is nn.GELU
            and act.approximate == "none"
            and type(drop1) is nn.Dropout
            and (drop1.p == 0.0 or not drop1.training)
            and type(fc2) is nn.Linear
            and hookless(act, drop1, fc2)
        )

    def can_add_in_chunks(self) -> bool:
        """Whether :meth:`add_in_chunks_` computes exactly what ``forward`` does (stock modules, no hooks)."""
        modules = self._modules
        fc1, drop2 = modules["fc1"], modules["drop2"]
        return (
            self.fuse_act_fc2
            and (type(fc1) is nn.Linear or (type(fc1) is DynamicLinear and not fc1.use_reference))
            and type(drop2) is nn.Dropout
            and (drop2.p == 0.0 or not drop2.training)
            and hookless(self, fc1, drop2)
            and self._can_fuse_act_fc2()
        )

    def add_in_chunks_(self, stream: Tensor, norm: nn.Module) -> None:
        """``stream += self(norm(stream))`` in place over chunks of tokens, so that no hidden-width tensor exists
        for the whole grid. Inference only, when :meth:`can_add_in_chunks`; ``stream`` (B, H, W, C), contiguous."""
        B, H, W, C = stream.shape
        fc1, fc2 = self.fc1, self.fc2
        if isinstance(fc1, DynamicLinear):
            normed = norm(stream)  # (B, H, W, C): the predictor pools the whole grid
            step = tokens_per_chunk(H * W, fc2.in_features, stream.element_size(), H * W)
            if step >= H * W:  # one chunk: the layer's own forward, which picks its cheaper form
                stream += gelu_linear(fc1(normed), fc2.weight, fc2.bias, consume=True)
                return
            weight_t = fc1.dynamic_weight(normed).transpose(1, 2)  # (B, C, hidden), per sample
            rows_in, rows_out = normed.view(B, H * W, C), stream.view(B, H * W, C)
            for start in range(0, H * W, step):
                hidden = torch.baddbmm(fc1.bias, rows_in[:, start:start + step], weight_t)  # (B, step, hidden)
                chunk = rows_out[:, start:start + step]  # a view: += writes into stream
                chunk += gelu_linear(hidden, fc2.weight, fc2.bias, consume=True)
            return
        rows = stream.view(-1, C)  # (B·H·W, C): a static fc1 is the same for every sample
        step = tokens_per_chunk(H * W, fc2.in_features, stream.element_size(), B * H * W)
        for start in range(0, B * H * W, step):
            chunk = rows[start:start + step]
            hidden = fc1(norm(chunk))  # (step, hidden)
            chunk += gelu_linear(hidden, fc2.weight, fc2.bias, consume=True)

    def forward(self, x: Tensor) -> Tensor:
        hidden = self.fc1(x)  # (B, H, W, hidden)
        if not torch.jit.is_scripting():  # TorchScript sees neither hooks nor autograd Functions
            if self.fuse_act_fc2 and self._can_fuse_act_fc2():
                # fc1's output may be overwritten in place unless a hook could have kept a reference to it
                # (global hooks are excluded above).
                consume = not self.fc1._forward_hooks
                return self.drop2(gelu_linear(hidden, self.fc2.weight, self.fc2.bias, consume=consume))
        return self.drop2(self.fc2(self.drop1(self.act(hidden))))


class Block(nn.Module):
    """One WeightFormer block: x = N(x); x = x + DWC(x); x = x + DropPath(MLP(LN(x))). Static blocks: a depthwise
    3×3 conv, a plain MLP, N = identity. Dynamic: :class:`DynamicDWConv`, a :class:`DynamicLinear` fc1 and N a
    LayerNorm on the residual stream, as in the authors' release. ``dynamic_dwc`` and ``dynamic_linear`` (None:
    ``dynamic``) choose the conv and fc1 apart from the rest: a dynamic block with a static conv, say."""

    def __init__(self, dim: int, mlp_ratio: float = 4.0, dynamic: bool = False, proj_drop: float = 0.0,
                 drop_path: float = 0.0, dwc_kernel_size: int = 3, linear_predictor: str = "bilateral",
                 dwc_predictor: str = "adaptive", predictor_reduction: int = 4,
                 norm_layer: Callable[..., nn.Module] = nn.LayerNorm, act_layer: Callable[..., nn.Module] = nn.GELU,
                 dynamic_dwc: Optional[bool] = None, dynamic_linear: Optional[bool] = None,
                 dwc_static_led: bool = False, dwc_padding: str = "zeros", device=None, dtype=None):
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        hidden = int(dim * mlp_ratio)
        self.dynamic = dynamic
        self.norm_stream = norm_layer(dim, **dd) if dynamic else nn.Identity()
        dynamic_dwc = dynamic if dynamic_dwc is None else dynamic_dwc
        dynamic_linear = dynamic if dynamic_linear is None else dynamic_linear
        if dynamic_dwc:
            self.dwc = DynamicDWConv(dim, dwc_kernel_size, predictor=dwc_predictor, static_led=dwc_static_led,
                                     padding=dwc_padding, **dd)
        else:
            self.dwc = static_depthwise_conv(dim, dwc_kernel_size, dwc_padding, **dd)
        if dynamic_linear:
            fc1 = DynamicLinear(dim, hidden, predictor=linear_predictor, reduction=predictor_reduction, **dd)
        else:
            fc1 = nn.Linear(dim, hidden, **dd)
        self.norm_mlp = norm_layer(dim, **dd)
        self.mlp = Mlp(fc1, hidden, dim, act_layer, proj_drop, dd)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, C) -> (B, H, W, C)
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript skips only a bare is_scripting() test)
            if eager_inference() and self._can_run_in_place():
                return self._forward_in_place(x)
        x = self.norm_stream(x)
        # permute gives the conv a channels-last view of the grid: no copy on the way in or out.
        x = x + self.dwc(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return x + self.drop_path(self.mlp(self.norm_mlp(x)))

    def _can_run_in_place(self) -> bool:
        """Whether :meth:`_forward_in_place` computes exactly what ``forward`` does (stock modules, no hooks)."""
        modules = self._modules
        norm_stream, dwc, norm_mlp, drop_path = (
            modules["norm_stream"], modules["dwc"], modules["norm_mlp"], modules["drop_path"])
        return (
            type(norm_stream) in (nn.Identity, nn.LayerNorm)
            and type(norm_mlp) is nn.LayerNorm
            and (type(dwc) is nn.Conv2d or (type(dwc) is DynamicDWConv and not dwc.use_reference))
            and (type(drop_path) is nn.Identity or not drop_path.training)
            and hookless(norm_stream, dwc, norm_mlp, drop_path)
            and modules["mlp"].can_add_in_chunks()
        )

    def _forward_in_place(self, x: Tensor) -> Tensor:
        """``forward`` without gradients, holding the input, the stream (the conv's output, x added in place) and
        one chunk of the MLP (:meth:`Mlp.add_in_chunks_`); x is not modified."""
        x = self.norm_stream(x)
        mixed = self.dwc(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)  # (B, H, W, C), a new tensor
        if mixed.is_contiguous():  # the conv's channels-last output; a batch through DynamicDWConv's fold is not
            stream = mixed.add_(x)
        else:
            stream = torch.add(x, mixed, out=torch.empty_like(x, memory_format=torch.contiguous_format))
        del x, mixed
        self.mlp.add_in_chunks_(stream, self.norm_mlp)
        return stream


class LinearClassifier:
    """timm's classifier API over ``self.head``, a linear layer on ``self.embed_dim`` pooled features."""

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool is not None:
            check_global_pool(global_pool)
            self.global_pool = global_pool
        self.num_classes = num_classes
        dd = get_device_dtype(self)  # the device and dtype of the model's first parameter
        self.head = nn.Linear(self.embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.head.train(self.training)


class WeightFormer(LinearClassifier, nn.Module):
    """WeightFormer classifier, with timm's model API (features, intermediates, classifier reset)."""

    def __init__(self, img_size: Union[int, Tuple[int, int]] = 224, patch_size: int = 16, in_chans: int = 3,
                 num_classes: int = 1000, global_pool: str = "avg", embed_dim: int = 384, depth: int = 17,
                 mlp_ratio: float = 4.0, dynamic_period: int = 3, dwc_kernel_size: int = 3,
                 linear_predictor: str = "bilateral", dwc_predictor: str = "adaptive", predictor_reduction: int = 4,
                 drop_rate: float = 0.0, proj_drop_rate: float = 0.0, drop_path_rate: float = 0.0,
                 norm_layer: Optional[Callable[..., nn.Module]] = None,
                 act_layer: Optional[Callable[..., nn.Module]] = None, dynamic_img_size: bool = True,
                 dynamic_img_pad: bool = False, dwc_dynamic_period: Optional[int] = None, dynamic_linear_start: int = 0,
                 dwc_static_led: bool = False, dwc_padding: str = "zeros", device=None, dtype=None):
        """``global_pool``: one of :data:`GLOBAL_POOLS`. ``dynamic_img_size`` must be True (no position embedding);
        ``dynamic_img_pad=True`` zero-pads the image to whole patches instead of dropping the pixels past the
        last whole patch, as the release does. ``dynamic_period`` chooses the dynamic blocks; ``dwc_dynamic_period``
        chooses, in the same way, those whose depthwise conv is dynamic (None: the dynamic blocks, as the release;
        it may name only dynamic blocks); the dynamic blocks before ``dynamic_linear_start`` keep a static fc1, so
        that ΔW is predicted only in the later blocks; ``dwc_static_led=True`` makes every dynamic conv start as
        the static blocks' conv with a small per-sample correction (:class:`DynamicDWConv`; docs/analysis.md §6);
        ``dwc_padding="background"`` pads every depthwise conv with the blank canvas's feature in place of zeros
        (layers/dynamic_dwconv.py), so that nothing in the model marks the canvas's edge."""
        super().__init__()
        check_global_pool(global_pool)
        check_dwc_padding(dwc_padding)
        if dynamic_img_size is not True:
            raise ValueError("dynamic_img_size must be True: WeightFormer has no position embedding, so it "
                             "always runs at any image size and has no fixed-size mode")
        for name, value in dict(embed_dim=embed_dim, depth=depth, patch_size=patch_size, in_chans=in_chans).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be positive, got {mlp_ratio!r}")
        if dynamic_period < 0:
            raise ValueError(f"dynamic_period must be >= 0 (0: all blocks static), got {dynamic_period}")
        convs = dynamic_conv_blocks(dwc_dynamic_period, dynamic_period, depth)
        linears = dynamic_linear_blocks(dynamic_linear_start, dynamic_period, depth)
        dd = dict(device=device, dtype=dtype)
        norm_layer = norm_layer or partial(nn.LayerNorm, eps=1e-6)
        act_layer = act_layer or nn.GELU
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.in_chans = in_chans
        self.patch_size = patch_size
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.dynamic_period = dynamic_period
        self.output_fmt = "NHWC"
        self.grad_checkpointing = False
        self.dynamic_img_pad = dynamic_img_pad
        # init_weights() draws every value again from the generator state the build started at (rewound_rng).
        with rewound_rng(device):
            # Any image size: _embed cuts or pads the image to whole patches first.
            self.patch_embed = WholePatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                               embed_dim=embed_dim, output_fmt="NHWC", strict_img_size=False, **dd)
            self.norm_pre = norm_layer(embed_dim, **dd)
            drop_path_rates = torch.linspace(0, drop_path_rate, depth, device="cpu").tolist()
            self.blocks = nn.Sequential(*[
                Block(embed_dim, mlp_ratio=mlp_ratio, dynamic=is_dynamic_block(i, dynamic_period),
                      proj_drop=proj_drop_rate, drop_path=drop_path_rates[i], dwc_kernel_size=dwc_kernel_size,
                      linear_predictor=linear_predictor, dwc_predictor=dwc_predictor,
                      predictor_reduction=predictor_reduction, norm_layer=norm_layer, act_layer=act_layer,
                      dynamic_dwc=convs[i], dynamic_linear=linears[i], dwc_static_led=dwc_static_led,
                      dwc_padding=dwc_padding, **dd)
                for i in range(depth)])
            self.norm = norm_layer(embed_dim, **dd)
            self.head_drop = nn.Dropout(drop_rate)
            self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.feature_info = [dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=patch_size) for i in range(depth)]
        self.init_weights()

    def init_weights(self, needs_reset: bool = True) -> None:
        """(Re)initialise every parameter and non-persistent buffer, as timm's ViT ``init_weights`` (so after
        ``to_empty()`` a meta-built model is whole): truncated-normal (0.02) linears, ``reset_parameters()`` on
        the other modules (children first); ``needs_reset=False`` leaves the latter as they are."""
        named_apply(partial(init_weights_vit_timm, needs_reset=needs_reset), self)
        reinit_non_persistent_buffers(self)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        # Norm weights and biases are 1-D and excluded by timm's optimizer factory already.
        return set()

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        return dict(stem=r"^patch_embed|^norm_pre", blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))])

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def set_implementation(self, name: str) -> None:
        """Select ``"fast"`` (default) or ``"reference"``: the paper's pseudocode for the dynamic
        layers and a plain GELU -> fc2 in every MLP, the baseline that speed-ups are measured against."""
        if name not in ("fast", "reference"):
            raise ValueError(f"implementation must be 'fast' or 'reference', got {name!r}")
        for module in self.modules():
            if isinstance(module, (DynamicLinear, DynamicDWConv)):
                module.use_reference = name == "reference"
            elif isinstance(module, Mlp):
                module.fuse_act_fc2 = name == "fast"

    @torch.jit.ignore
    def set_input_size(self, img_size: Optional[Union[int, Tuple[int, int]]] = None,
                       patch_size: Optional[Union[int, Tuple[int, int]]] = None) -> None:
        """Change the nominal image size (timm's record of it; ``pretrained_cfg`` stays) and/or the square patch
        size (the projection resampled, ``feature_info`` updated), as timm's ViT ``set_input_size`` does."""
        if patch_size is not None:
            side = to_2tuple(patch_size)
            if side[0] != side[1] or not isinstance(side[0], int) or side[0] < 1:
                raise ValueError(f"patch_size must be a positive integer (square patches), got {patch_size!r}")
            patch_size = side[0]
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        if patch_size is not None:
            self.patch_size = patch_size
            for info in self.feature_info:
                info["reduction"] = patch_size
        update_model_input_size(self, self.patch_embed.img_size, patch_size=patch_size)

    def _embed(self, x: Tensor) -> Tensor:  # (B, C_in, H_img, W_img) -> (B, H, W, C), H = ⌊H_img/p⌋ (⌈⌉ padded)
        if self.dynamic_img_pad:
            check_image_batch(x, self.in_chans, 1)
            x = pad_to_whole_patches(x, self.patch_size)
        else:
            check_image_batch(x, self.in_chans, self.patch_size)
            x = whole_patches(x, self.patch_size)
        return self.norm_pre(self.patch_embed(x))

    def forward_features(self, x: Tensor) -> Tensor:  # (B, C_in, H_img, W_img) -> (B, H, W, C)
        x = self._embed(x)
        for blk in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x)
            else:
                x = blk(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:  # (B, H, W, C) -> (B, classes)
        if self.global_pool == "avg":  # what global_pool_nlc does, without its flatten and slice
            x = x.mean(dim=(1, 2))  # (B, C)
        elif self.global_pool:
            x = global_pool_nlc(x.flatten(1, 2), self.global_pool, num_prefix_tokens=0)  # (B, H·W, C) -> (B, C)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: Tensor, indices: Optional[Union[int, List[int]]] = None, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW", intermediates_only: bool = False
                              ) -> Union[List[Tensor], Tuple[Tensor, List[Tensor]]]:
        """The outputs of the chosen blocks (the last n for an int, all for None), "NCHW" or "NHWC", through the
        final norm if ``norm``; (final features, intermediates) unless ``intermediates_only``."""
        if output_fmt not in ("NCHW", "NHWC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x = self._embed(x)
        blocks = self.blocks if torch.jit.is_scripting() or not stop_early else self.blocks[: max_index + 1]
        intermediates = []
        for i, blk in enumerate(blocks):
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(blk, x)
            else:
                x = blk(x)
            if i in take_indices:
                y = self.norm(x) if norm else x
                intermediates.append(y.permute(0, 3, 1, 2).contiguous() if output_fmt == "NCHW" else y)
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def prune_intermediate_layers(self, indices: Union[int, List[int]] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> List[int]:
        """Drop the blocks after the last one in ``indices`` (and the norm and head if asked)."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


# The authors' checkpoints: their key (after "blocks.{i}.") -> ours. Their dynamic linear's static weight is (in, out).
_BLOCK_KEY_MAP = {
    "norm1": "norm_stream", "norm2": "norm_mlp", "linear1.w": "mlp.fc1.weight", "linear1.b": "mlp.fc1.bias",
    "linear1.wfm": "mlp.fc1.predictor.proj", "linear1.w1": "mlp.fc1.predictor.in_basis",
    "linear1.w2": "mlp.fc1.predictor.out_basis", "linear1": "mlp.fc1", "linear2": "mlp.fc2", "dwc.w": "dwc.weight",
    "dwc.b": "dwc.bias", "dwc.wfm.0": "dwc.predictor.fc1", "dwc.wfm.2": "dwc.predictor.fc2",
}
_TOP_KEY_MAP = {"init_norm": "norm_pre"}


def _rename(key: str, mapping: Dict[str, str]) -> str:
    """Replace the longest mapped prefix of ``key`` (prefixes end at a '.')."""
    for old in sorted(mapping, key=len, reverse=True):
        if key == old or key.startswith(old + "."):
            return mapping[old] + key[len(old):]
    return key


def checkpoint_filter_fn(state_dict: Dict[str, Tensor], model: WeightFormer) -> Dict[str, Tensor]:
    """Translate a state dict of the authors' ``VisionTransformer`` (or a wrapped/DDP one) to ours: their Hub
    safetensors, their training checkpoints' ``"model"`` entry, or our own keys (only unwrapped)."""
    for wrapper in ("model", "state_dict"):
        if wrapper in state_dict and isinstance(state_dict[wrapper], dict):
            state_dict = state_dict[wrapper]
    state_dict = strip_wrapper_prefixes(state_dict)
    if "init_norm.weight" not in state_dict:
        return state_dict
    out = {}
    for key, value in state_dict.items():
        if key.startswith("blocks."):
            _, index, rest = key.split(".", 2)
            new_rest = _rename(rest, _BLOCK_KEY_MAP)
            if rest == "linear1.w":
                value = value.t().contiguous()  # (in, out) -> (out, in)
            key = f"blocks.{index}.{new_rest}"
        else:
            key = _rename(key, _TOP_KEY_MAP)
        out[key] = value
    return out


def _cfg(hf_hub_id: str, input_size: int, **kwargs) -> Dict[str, Any]:
    pool = input_size // 16
    return {
        "hf_hub_id": hf_hub_id, "num_classes": 1000, "input_size": (3, input_size, input_size),
        "pool_size": (pool, pool), "crop_pct": 0.875,
        "crop_mode": "squash",  # the release resizes to (256/224·s)² and centre-crops s
        "interpolation": "bicubic", "fixed_input_size": False, "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD, "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit",
        "paper_ids": "arXiv:2605.01711",
        "paper_name": "Linear-Time Global Visual Modeling without Explicit Attention",
        "origin_url": "https://github.com/LeapLabTHU/WeightFormer",
        **kwargs,
    }


default_cfgs = generate_default_cfgs({
    "weightformer_tiny.in1k": _cfg("RuizeHe/weightformer-t", 224),
    "weightformer_small.in1k": _cfg("RuizeHe/weightformer-s", 224),
    "weightformer_base.in1k_448": _cfg("RuizeHe/weightformer-b", 448),
})


def _create_weightformer(variant: str, pretrained: bool = False, **kwargs) -> WeightFormer:
    out_indices = kwargs.pop("out_indices", 3)
    with release_pickle_globals():  # timm's loader may read the authors' training .pth (pickled yacs config)
        return build_model_with_cfg(WeightFormer, variant, pretrained, pretrained_filter_fn=checkpoint_filter_fn,
                                    feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **kwargs)


@register_model
def weightformer_tiny(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-T: 192-d, depth 17, patch 16, 224 px (ImageNet-1K top-1 76.3 in the paper)."""
    args = dict(patch_size=16, embed_dim=192, depth=17)
    return _create_weightformer("weightformer_tiny", pretrained, **dict(args, **kwargs))


@register_model
def weightformer_small(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-S: 384-d, depth 17, patch 16, 224 px (ImageNet-1K top-1 81.3 in the paper)."""
    args = dict(patch_size=16, embed_dim=384, depth=17)
    return _create_weightformer("weightformer_small", pretrained, **dict(args, **kwargs))


@register_model
def weightformer_base(pretrained: bool = False, **kwargs) -> WeightFormer:
    """WeightFormer-B: WeightFormer-S at 448 px (about 83.4 top-1, read off the paper's Figure 1)."""
    args = dict(patch_size=16, embed_dim=384, depth=17, img_size=448)
    return _create_weightformer("weightformer_base", pretrained, **dict(args, **kwargs))
