"""Dynamic layers: formulas, fast path == paper pseudocode, shapes, and attention as a dynamic MLP."""

import copy

import pytest
import torch
import torch.nn.functional as F

from weightformer.layers import (
    DWCONV_PREDICTORS,
    LINEAR_PREDICTORS,
    DynamicDWConv,
    DynamicLinear,
    attention_as_mlp,
    pool_2x2,
)
from weightformer.layers.dynamic_dwconv import BackgroundPaddedConv2d
from layer_formulas import dwconv_layer, dwconv_update, linear_layer, linear_update


def _randomise(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Large random weights so the dynamic branch is far from zero and every term is tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


# Standard deviations of the predictors' weights that give updates of norm about 0.1 to 10 before
# the normalisation Δ/(‖Δ‖+1), so the tests see its scale: at ‖Δ‖ ≫ 1 it would hide the C^-1/2/N
# factor and the eps (the tests assert the range they run in).
LINEAR_STD = {"bilateral": 0.8, "deep": 0.7, "gap": 0.8, "linear": 0.7, "nonlinear": 0.8}
DWCONV_STD = {"adaptive": 0.4, "amp_dir": 0.8, "conv": 0.35, "gap": 0.8}
# Even, odd, non-square, and 1-wide grids; the release itself runs only the square ones from 2×2.
GRIDS = [(4, 4), (7, 9), (13, 13), (2, 3), (1, 6), (5, 1), (1, 1)]


def _realistic(module: torch.nn.Module, predictor_std: float, seed: int = 0) -> dict:
    """float64, predictor weights of std ``predictor_std``, static weights of std 0.3; returns the state dict."""
    module.double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            std = predictor_std if name.startswith("predictor.") else 0.3
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return module.state_dict()


def _assert_layer_is_formula(layer, implementation: str, input_shape, formula, update_norms) -> None:
    """layer(x) == formula(x) in float64 on every grid of GRIDS, in an unsaturated regime.

    ``input_shape(grid)`` gives x's shape; ``update_norms(x)`` the norms of the predicted updates
    before the normalisation, whose median must lie in (0.1, 10).
    """
    layer.use_reference = implementation == "reference"
    g = torch.Generator().manual_seed(1)
    norms = []
    with torch.no_grad():
        for grid in GRIDS:
            x = torch.randn(input_shape(grid), generator=g, dtype=torch.double)
            torch.testing.assert_close(layer(x), formula(x), rtol=1e-10, atol=1e-10)
            norms.append(update_norms(x).flatten())
    median = torch.cat(norms).median().item()
    assert 0.1 < median < 10, f"update norms (median {median:.3g}) saturate or vanish: rescale the predictor weights"


@pytest.mark.parametrize("shape", [(2, 4, 16, 8), (1, 2, 1, 8), (3, 1, 33, 16)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_attention_as_mlp_equals_sdpa(shape, scale):
    b, h, n, d = shape
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float32) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, scale=scale)
    torch.testing.assert_close(attention_as_mlp(q, k, v, scale=scale), expected, rtol=1e-5, atol=1e-6)


def test_attention_as_mlp_cross_attention_shapes():
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 11, 8), torch.randn(2, 11, 3)
    torch.testing.assert_close(attention_as_mlp(q, k, v), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("grid", [(6, 10), (7, 7), (13, 13), (3, 8), (2, 5)])
def test_pool_2x2_is_the_release_avgpool(grid):
    """Floors like the release's AvgPool2d(2): an odd side's last row or column is not pooled."""
    x = torch.randn(2, *grid, 5)  # (B, H, W, C)
    expected = torch.nn.AvgPool2d(2)(x.permute(0, 3, 1, 2)).flatten(2).transpose(1, 2)
    torch.testing.assert_close(pool_2x2(x), expected)


def test_pool_2x2_keeps_a_side_of_one():
    """Where the release cannot pool (a side of 1), that side is kept: a window of 1 along it."""
    x = torch.arange(5.0).reshape(1, 1, 5, 1)  # (B, 1, 5, C): pairs along W, the 5th token left out
    torch.testing.assert_close(pool_2x2(x), torch.tensor([[[0.5], [2.5]]]))
    torch.testing.assert_close(pool_2x2(x.transpose(1, 2)), torch.tensor([[[0.5], [2.5]]]))
    one = torch.randn(3, 1, 1, 4)
    torch.testing.assert_close(pool_2x2(one), one.reshape(3, 1, 4))


@pytest.mark.parametrize("grid", [(14, 14), (7, 9), (1, 1), (2, 3)])
def test_dynamic_linear_fast_equals_reference(grid):
    layer = DynamicLinear(16, 64)
    _randomise(layer)
    x = torch.randn(3, *grid, 16)
    fast = layer(x)
    layer.use_reference = True
    ref = layer(x)
    assert fast.shape == (3, *grid, 64)
    assert _rel_err(fast, ref) <= 1e-5


@pytest.mark.parametrize("implementation", ["fast", "reference"])
@pytest.mark.parametrize("predictor", sorted(LINEAR_STD))
def test_dynamic_linear_matches_its_formula(predictor, implementation):
    layer = DynamicLinear(16, 32, predictor=predictor)
    sd = _realistic(layer, LINEAR_STD[predictor])
    _assert_layer_is_formula(
        layer,
        implementation,
        lambda grid: (2, *grid, 16),
        lambda x: linear_layer(predictor, sd, x),
        lambda x: linear_update(predictor, sd, x).norm(dim=1),  # (B, O): one norm per output column
    )


@pytest.mark.parametrize("predictor_std", [0.8, 5.0])  # updates of norm about 1, and about 10^4
def test_dynamic_linear_normalises_each_update_column(predictor_std):
    """The layer's own normalisation: its effective weight, read back from its output, is W + ΔW/(‖ΔW‖+1)."""
    layer = DynamicLinear(8, 12)
    sd = _realistic(layer, predictor_std, seed=3)
    x = torch.randn(1, 4, 4, 8, generator=torch.Generator().manual_seed(4), dtype=torch.double)
    with torch.no_grad():
        out = layer(x) - sd["bias"]  # (1, 4, 4, 12)
    # 16 tokens of 8 features: the effective weight (8, 12) is the exact least-squares solution.
    weight = torch.linalg.lstsq(x.reshape(16, 8), out.reshape(16, 12)).solution  # (C, O)
    update_norms = (weight - sd["weight"].T).norm(dim=0)  # ‖ΔŴ‖ per output column
    delta_norms = linear_update("bilateral", sd, x)[0].norm(dim=0)
    torch.testing.assert_close(update_norms, delta_norms / (delta_norms + 1), rtol=1e-8, atol=1e-10)
    assert (update_norms < 1).all()


# Every predictor of both layers, each with an input of mixed odd and even sides.
EVERY_PREDICTOR = [("linear", p) for p in sorted(LINEAR_PREDICTORS)]
EVERY_PREDICTOR += [("dwconv", p) for p in sorted(DWCONV_PREDICTORS)]


def _layer_and_input(kind: str, predictor: str, std: float = 0.3) -> tuple:
    if kind == "linear":
        layer, x = DynamicLinear(16, 32, predictor=predictor), torch.randn(2, 5, 6, 16)  # -> (2, 5, 6, 32)
    else:
        layer, x = DynamicDWConv(8, 5, predictor=predictor), torch.randn(2, 8, 7, 5)  # -> (2, 8, 7, 5)
    _randomise(layer, std=std)
    if predictor.startswith("double_centered_gated"):
        # Its gain is g₀·exp(30·s): a random s of std 0.1-0.3 makes g up to e^9 times g₀, and bf16's rounding of s
        # 30 times larger in g. Trained s lies in [-0.05, 0.02] for the gated predictor, [-0.14, 0.01] for the led
        # one (docs/analysis.md §6).
        with torch.no_grad():
            layer.predictor.gain.fill_(-0.05)
    return layer, x


@pytest.mark.parametrize("kind, predictor", EVERY_PREDICTOR)
def test_predictors_run_and_train(kind, predictor):
    layer, x = _layer_and_input(kind, predictor)
    x.requires_grad_(True)
    y = layer(x)
    assert y.shape == ((2, 5, 6, 32) if kind == "linear" else x.shape)
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
    # the prediction depends on the input: a different sample gives a different weight
    with torch.no_grad():
        assert not torch.allclose(layer.predictor(x[:1]), layer.predictor(x[1:]))


# bf16 keeps 8 significant bits (a relative step of 2^-8 ≈ 0.4%): a layer's output must stay within
# 1% of float32's (relative L2 error; measured 0.3-0.4% for every predictor).
# The unit-scaled predictors' ΔW is as long here as after training only for the gated one (the others' random
# gain is about 0.1, against g₀ ≈ 33 at these sizes); at that length every unit predictor's bf16 error reaches
# 1.0-1.1% on some inputs (30 inputs: double_centered 1.01%, centered 0.90%, gated 1.11%).
BF16_TOLERANCE = {"double_centered_gated": 1.5e-2, "double_centered_gated_led": 1.5e-2}


@pytest.mark.parametrize("kind, predictor", EVERY_PREDICTOR)
def test_bf16_matches_float32(kind, predictor):
    layer, x = _layer_and_input(kind, predictor, std=0.1)
    with torch.no_grad():
        expected = layer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = layer(x)
        weights_bf16 = copy.deepcopy(layer).to(torch.bfloat16)(x.to(torch.bfloat16))
    for out in (autocast, weights_bf16):
        assert out.dtype == torch.bfloat16
        assert _rel_err(out.float(), expected) <= BF16_TOLERANCE.get(predictor, 1e-2)


def test_dynamic_linear_is_per_sample():
    layer = DynamicLinear(16, 32)
    _randomise(layer)
    x = torch.randn(4, 6, 6, 16)
    with torch.no_grad():
        batched = layer(x)
        single = torch.cat([layer(x[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-6)


def test_dynamic_linear_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown dynamic linear predictor"):
        DynamicLinear(16, 32, predictor="attention")
    with pytest.raises(ValueError, match="divisible"):
        DynamicLinear(10, 32)
    with pytest.raises(ValueError, match="expected 16 input features"):
        DynamicLinear(16, 32)(torch.randn(1, 2, 2, 8))


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kernel_size", [1, 3, 5, 7])
@pytest.mark.parametrize("grid", [(14, 14), (5, 9), (1, 1)])
def test_dynamic_dwconv_fast_equals_reference(batch, kernel_size, grid):
    layer = DynamicDWConv(8, kernel_size)
    _randomise(layer)
    x = torch.randn(batch, 8, *grid)
    fast = layer(x)
    layer.use_reference = True
    ref = layer(x)
    assert fast.shape == x.shape
    assert _rel_err(fast, ref) <= 1e-5


def test_dynamic_dwconv_channels_last_input():
    layer = DynamicDWConv(8)
    _randomise(layer)
    x = torch.randn(2, 8, 6, 6)
    torch.testing.assert_close(layer(x.contiguous(memory_format=torch.channels_last)), layer(x))


@pytest.mark.parametrize("implementation", ["fast", "reference"])
@pytest.mark.parametrize("predictor", sorted(DWCONV_STD))
@pytest.mark.parametrize("kernel_size", [3, 5])
def test_dynamic_dwconv_matches_its_formula(predictor, kernel_size, implementation):
    layer = DynamicDWConv(8, kernel_size, predictor=predictor)
    sd = _realistic(layer, DWCONV_STD[predictor])
    _assert_layer_is_formula(
        layer,
        implementation,
        lambda grid: (2, 8, *grid),
        lambda x: dwconv_layer(predictor, sd, x, kernel_size),
        lambda x: dwconv_update(predictor, sd, x, kernel_size).flatten(2).norm(dim=-1),  # (B, C): one per kernel
    )


@pytest.mark.parametrize("implementation", ["fast", "reference"])
@pytest.mark.parametrize("static_led, scale", [(False, 1.0), (True, 0.1)])  # the release's; ΔK a tenth as large
@pytest.mark.parametrize("predictor_std", [0.4, 5.0])  # updates of norm about 1, and about 10^3
def test_dynamic_dwconv_normalises_each_update_kernel(predictor_std, static_led, scale, implementation):
    """The layer's own normalisation: its kernels, read back from its output, are K + sΔK/(‖sΔK‖+1)."""
    C, K = 4, 3
    layer = DynamicDWConv(C, K, static_led=static_led)
    layer.use_reference = implementation == "reference"
    sd = _realistic(layer, predictor_std, seed=5)
    x = torch.randn(1, C, 6, 6, generator=torch.Generator().manual_seed(6), dtype=torch.double)
    with torch.no_grad():
        out = layer(x) - sd["bias"][:, None, None]  # (1, C, 6, 6)
    patches = F.unfold(x, K, padding=K // 2).reshape(C, K * K, 36).transpose(1, 2)  # (C, 36 pixels, K·K)
    # 36 pixels per channel for 9 kernel taps: the kernels are the exact least-squares solution.
    kernel = torch.linalg.lstsq(patches, out.reshape(C, 36, 1)).solution.reshape(C, K, K)
    delta = scale * dwconv_update("adaptive", sd, x, K)[0]  # (C, K, K)
    delta_norms = delta.flatten(1).norm(dim=-1)
    expected = delta / (delta_norms + 1)[:, None, None]
    torch.testing.assert_close(kernel - sd["weight"][:, 0], expected, rtol=1e-7, atol=1e-10)
    assert (expected.flatten(1).norm(dim=-1) < 1).all()


def test_static_led_dwconv_starts_as_the_static_blocks_conv():
    """Its static kernel and bias are nn.Conv2d's draws (the static blocks' depthwise conv), about ten times the
    release's; its per-sample correction starts about a tenth of that."""
    C, K = 16, 3
    layer, release = DynamicDWConv(C, K, static_led=True), DynamicDWConv(C, K)
    conv = torch.nn.Conv2d(C, C, K, padding=K // 2, groups=C)
    torch.manual_seed(3)
    layer.reset_parameters()
    torch.manual_seed(3)
    conv.reset_parameters()
    torch.testing.assert_close(layer.weight, conv.weight, rtol=0, atol=0)
    torch.testing.assert_close(layer.bias, conv.bias, rtol=0, atol=0)
    static_norm = layer.weight.flatten(1).norm(dim=-1).mean()
    assert static_norm > 5 * release.weight.flatten(1).norm(dim=-1).mean()
    x = torch.randn(2, C, 8, 8)
    with torch.no_grad():
        correction = layer.predicted_delta(x).flatten(2).norm(dim=-1).mean()
        assert correction < static_norm / 4
        assert layer.predicted_delta(x).flatten(2).norm(dim=-1).max() < 1
    assert "static_led=True" in repr(layer) and "static_led" not in repr(release)


def test_static_led_dwconv_scripts_as_eager():
    """TorchScript through the static-led branch (its traced form: tests/test_export_layers.py)."""
    torch.manual_seed(0)
    layer = DynamicDWConv(8, 3, static_led=True).double()
    x = torch.randn(2, 8, 6, 7, dtype=torch.double)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(layer)(x), layer(x))


def _median_bordered_conv(x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A depthwise conv per sample and channel over the grid drawn on a canvas filled with that channel's lower
    median (sorted values, index (n - 1) // 2); x (B, C, H, W), kernel (B, C, K, K), bias (C,)."""
    B, C, H, W = x.shape
    p = kernel.shape[-1] // 2
    out = torch.empty_like(x)
    for b in range(B):
        for c in range(C):
            values = x[b, c].flatten().sort().values
            canvas = torch.full((H + 2 * p, W + 2 * p), values[(values.numel() - 1) // 2].item(), dtype=x.dtype)
            canvas[p:p + H, p:p + W] = x[b, c]
            out[b, c] = F.conv2d(canvas[None, None], kernel[b, c][None, None])[0, 0] + bias[c]
    return out


@pytest.mark.parametrize("size", [(6, 7), (5, 5), (1, 4)])
@pytest.mark.parametrize("implementation", ["fast", "reference"])
def test_background_padded_dwconv_is_a_conv_on_a_median_filled_canvas(size, implementation):
    """dwc_padding="background": each channel's grid drawn on a canvas of its median, then an unpadded conv."""
    torch.manual_seed(0)
    layer = DynamicDWConv(6, 3, predictor="offset_corr", static_led=True, padding="background").double()
    layer.use_reference = implementation == "reference"
    x = torch.randn(2, *size, 6, dtype=torch.float64).permute(0, 3, 1, 2)  # channels-last, as in the blocks
    with torch.no_grad():
        kernel = layer.predicted_delta(x) + layer.weight[:, 0]  # (B, C, K, K)
        torch.testing.assert_close(layer(x), _median_bordered_conv(x, kernel, layer.bias))
    assert "padding=background" in repr(layer) and "padding" not in repr(DynamicDWConv(6, 3))


def test_background_padded_static_conv_is_a_conv_on_a_median_filled_canvas():
    torch.manual_seed(0)
    conv = BackgroundPaddedConv2d(5, 3).double()
    x = torch.randn(3, 5, 4, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(conv(x), _median_bordered_conv(x, conv.weight[:, 0].expand(3, -1, -1, -1),
                                                                  conv.bias))
    assert [k for k, _ in conv.named_parameters()] == ["weight", "bias"]  # the static blocks' checkpoint keys


def test_background_padding_keeps_a_blank_canvas_blank_to_its_edge():
    """A uniform grid stays uniform, edge tokens included; with zero padding the edge tokens differ."""
    torch.manual_seed(0)
    fill = torch.randn(2, 8, 1, 1).expand(2, 8, 6, 6)
    for padding, uniform in (("background", True), ("zeros", False)):
        layer = DynamicDWConv(8, 3, predictor="offset_corr", static_led=True, padding=padding)
        with torch.no_grad():
            out = layer(fill)
        assert torch.allclose(out, out[:, :, 2:3, 2:3].expand_as(out), atol=1e-6) is uniform


@pytest.mark.parametrize("n", [1, 6, 7])
def test_lower_median_is_torch_median_and_reads_an_expanded_tensor(n):
    from weightformer.layers.dynamic_layer import lower_median

    x = torch.randn(3, n, 4)
    torch.testing.assert_close(lower_median(x, 1), x.median(dim=1, keepdim=True).values, rtol=0, atol=0)
    column = torch.randn(3, 1, 4)
    torch.testing.assert_close(lower_median(column.expand(3, n, 4), 1), column, rtol=0, atol=0)  # stride 0


def test_background_padded_dwconv_scripts_as_eager():
    torch.manual_seed(0)
    layer = DynamicDWConv(8, 3, static_led=True, padding="background").double()
    x = torch.randn(2, 8, 6, 7, dtype=torch.double)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(layer)(x), layer(x))


def test_dynamic_dwconv_is_per_sample():
    layer = DynamicDWConv(8)
    _randomise(layer)
    x = torch.randn(3, 8, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), torch.cat([layer(x[i:i + 1]) for i in range(3)]), rtol=1e-5, atol=1e-6)


def test_dynamic_dwconv_rejects_bad_arguments():
    with pytest.raises(ValueError, match="odd"):
        DynamicDWConv(8, 4)
    with pytest.raises(ValueError, match="unknown dynamic depthwise-conv predictor"):
        DynamicDWConv(8, predictor="nope")
    with pytest.raises(ValueError, match="expected 8 channels"):
        DynamicDWConv(8)(torch.randn(1, 4, 5, 5))
    with pytest.raises(ValueError, match="dwc_static_led. must be True or False, got 'yes'"):
        DynamicDWConv(8, static_led="yes")
    with pytest.raises(ValueError, match="dwc_padding must be one of zeros, background, got 'reflect'"):
        DynamicDWConv(8, padding="reflect")


def test_gelu_linear_matches_autograd_exactly():
    from weightformer.layers.gelu_linear import gelu_linear

    h = torch.randn(2, 3, 5, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    g = torch.randn(2, 3, 5, 8)
    expected = torch.autograd.grad(F.linear(F.gelu(h), w, b), (h, w, b), g)
    got = torch.autograd.grad(gelu_linear(h, w, b), (h, w, b), g)
    for e, o in zip(expected, got):
        torch.testing.assert_close(o, e, rtol=1e-6, atol=1e-6)
    args = [torch.randn(*s, dtype=torch.double, requires_grad=True) for s in [(3, 4), (5, 4), (5,)]]
    assert torch.autograd.gradcheck(gelu_linear, args)


def test_gelu_linear_under_bf16_autocast():
    from weightformer.layers.gelu_linear import gelu_linear

    h = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = gelu_linear(h, w, b)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert h.grad.dtype == w.grad.dtype == b.grad.dtype == torch.float32
    assert all(torch.isfinite(t.grad).all() for t in (h, w, b))


def test_gelu_linear_without_grad_matches_and_consumes_its_input_only_when_asked():
    from weightformer.layers.gelu_linear import gelu_linear

    h, w, b = torch.randn(6, 16), torch.randn(8, 16), torch.randn(8)
    expected = F.linear(F.gelu(h), w, b)
    with torch.no_grad():
        kept = h.clone()
        torch.testing.assert_close(gelu_linear(kept, w, b), expected)
        torch.testing.assert_close(kept, h)  # not consumed unless asked
        torch.testing.assert_close(gelu_linear(h.clone(), w, b, consume=True), expected)
    with torch.inference_mode():
        torch.testing.assert_close(gelu_linear(h.clone(), w, b, consume=True), expected)


def test_add_normalised_rows_gradients():
    from weightformer.layers.dynamic_linear import add_normalised_rows

    w = torch.randn(5, 7, dtype=torch.double, requires_grad=True)
    d = torch.randn(3, 5, 7, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(add_normalised_rows, (w, d))
    expected = w + d / (d.norm(dim=-1, keepdim=True) + 1)
    torch.testing.assert_close(add_normalised_rows(w, d), expected)
    # a zero update has the identity as its derivative, not NaN
    zero = torch.zeros(1, 5, 7, dtype=torch.double, requires_grad=True)
    g = torch.randn(1, 5, 7, dtype=torch.double)
    (grad,) = torch.autograd.grad(add_normalised_rows(w.detach(), zero), zero, g)
    torch.testing.assert_close(grad, g)


@pytest.mark.parametrize("predictor", ["bilateral", "linear", "nonlinear", "deep", "gap"])
@pytest.mark.parametrize("grid, low_rank", [((4, 5), True), ((6, 7), False)])
def test_dynamic_linear_low_rank_and_dense_forms_match_the_formulas_with_gradients(predictor, grid, low_rank):
    """C=32, O=128: the low-rank form applies below C·O/(C+O) = 25.6 tokens a sample (20 here; 42 take the dense form)."""
    layer = DynamicLinear(32, 128, predictor=predictor).double()
    _randomise(layer, std=0.1)
    H, W = grid
    x = torch.randn(2, H, W, 32, dtype=torch.float64, requires_grad=True)
    assert layer.applies_low_rank(H * W) is low_rank
    ours = layer(x)
    sd = {k: v.detach().clone().requires_grad_(True) for k, v in layer.state_dict().items()}
    expected = linear_layer(predictor, sd, x)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)
    g = torch.randn_like(ours)
    names = [n for n, _ in layer.named_parameters()]
    got = torch.autograd.grad(ours, [x, *layer.parameters()], g)
    want = torch.autograd.grad(expected, [x, *(sd[n] for n in names)], g, allow_unused=True)
    for name, a, b in zip(["x", *names], got, want):
        torch.testing.assert_close(a, b if b is not None else torch.zeros_like(a), rtol=1e-8, atol=1e-10, msg=name)


def test_dynamic_linear_low_rank_form_has_finite_gradients_at_a_zero_update():
    layer = DynamicLinear(32, 128)
    with torch.no_grad():
        layer.predictor.proj.bias.zero_()  # a zero input then gives σ(P) = 0, a zero core and ΔW = 0
    x = torch.zeros(1, 2, 2, 32, requires_grad=True)
    assert layer.applies_low_rank(4)
    layer(x).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters()) and torch.isfinite(x.grad).all()


def test_a_hook_on_the_predictor_sees_delta_w_where_the_low_rank_form_would_apply():
    """The analysis tools read ΔWᵀ (B, O, C) through a forward hook on the predictor: a hooked predictor
    keeps the dense form, which calls it, and the output is the same function."""
    layer = DynamicLinear(32, 128).double()
    _randomise(layer, std=0.1)
    x = torch.randn(2, 4, 5, 32, dtype=torch.float64)
    unhooked = layer(x)
    seen = []
    handle = layer.predictor.register_forward_hook(lambda module, args, out: seen.append(out))
    try:
        assert not layer.applies_low_rank(20)
        hooked = layer(x)
    finally:
        handle.remove()
    assert layer.applies_low_rank(20)
    assert len(seen) == 1 and seen[0].shape == (2, 128, 32)
    torch.testing.assert_close(hooked, unhooked, rtol=1e-10, atol=1e-10)
