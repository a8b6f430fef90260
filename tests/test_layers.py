"""Dynamic layers: formulas, fast path == paper pseudocode, shapes, and attention as a dynamic MLP."""

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


def _randomise(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> None:
    """Large random weights so the dynamic branch is far from zero and every term is tested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


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


def test_pool_2x2_matches_avgpool_on_even_grids():
    x = torch.randn(2, 6, 10, 5)  # (B, H, W, C)
    expected = F.avg_pool2d(x.permute(0, 3, 1, 2), 2).flatten(2).transpose(1, 2)
    torch.testing.assert_close(pool_2x2(x), expected)


@pytest.mark.parametrize("grid", [(1, 1), (3, 5), (7, 7), (1, 9)])
def test_pool_2x2_odd_grids_cover_every_token(grid):
    x = torch.zeros(1, *grid, 4)
    x[:, -1, -1] = 1.0  # the last token must reach the pooled output
    pooled = pool_2x2(x)
    assert pooled.shape == (1, ((grid[0] + 1) // 2) * ((grid[1] + 1) // 2), 4)
    assert pooled.sum() > 0


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


def test_dynamic_linear_formula_by_hand():
    """ΔW = Aᵀ·B·in^-0.5/N with A, B from SiLU'd pooled projections, then column-normalised."""
    layer = DynamicLinear(8, 12)
    _randomise(layer, seed=3)
    x = torch.randn(1, 4, 4, 8)
    p = layer.predictor
    pooled = F.avg_pool2d(x.permute(0, 3, 1, 2), 2).flatten(2).transpose(1, 2)[0]  # (4, 8)
    proj = pooled @ p.proj.weight.T + p.proj.bias
    a = F.silu(proj[:, :2]) @ p.in_basis  # (4, 8)
    b = F.silu(proj[:, 2:]) @ p.out_basis  # (4, 12)
    delta = a.T @ b * 8**-0.5 / 16
    delta = delta / (delta.norm(dim=0, keepdim=True) + 1)
    expected = x[0].reshape(16, 8) @ (layer.weight.T + delta) + layer.bias
    torch.testing.assert_close(layer(x)[0].reshape(16, 12), expected, rtol=1e-5, atol=1e-5)


def test_dynamic_linear_update_columns_are_shorter_than_one():
    layer = DynamicLinear(8, 8)
    _randomise(layer, std=5.0)
    x = torch.randn(2, 4, 4, 8) * 10
    with torch.no_grad():
        delta = layer.predictor(x)
        delta = delta / (delta.norm(dim=-1, keepdim=True) + 1)  # ΔWᵀ: a row per output column
    assert (delta.norm(dim=-1) < 1).all()


@pytest.mark.parametrize("predictor", sorted(LINEAR_PREDICTORS))
def test_dynamic_linear_predictors_run_and_train(predictor):
    layer = DynamicLinear(16, 32, predictor=predictor)
    _randomise(layer)
    x = torch.randn(2, 5, 6, 16, requires_grad=True)
    y = layer(x)
    assert y.shape == (2, 5, 6, 32)
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
    # the prediction depends on the input: a different sample gives a different weight
    with torch.no_grad():
        assert not torch.allclose(layer.predictor(x[:1]), layer.predictor(x[1:]))


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


def test_dynamic_dwconv_formula_by_hand():
    """K̂ = K + ΔK/(‖ΔK‖+1), ΔK = W₂∗GELU(W₁∗AdaptiveAvgPool₃(X)+b₁); depthwise conv, same padding."""
    layer = DynamicDWConv(4)
    _randomise(layer, seed=5)
    x = torch.randn(1, 4, 6, 6)
    p = layer.predictor
    pooled = F.adaptive_avg_pool2d(x, 3)
    delta = p.fc2(F.gelu(p.fc1(pooled)))[0]  # (4, 3, 3)
    delta = delta / (delta.flatten(1).norm(dim=1)[:, None, None] + 1)
    kernel = layer.weight + delta.unsqueeze(1)
    expected = F.conv2d(x, kernel, layer.bias, padding=1, groups=4)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("predictor", sorted(DWCONV_PREDICTORS))
def test_dynamic_dwconv_predictors_run_and_train(predictor):
    layer = DynamicDWConv(8, 5, predictor=predictor)
    _randomise(layer)
    x = torch.randn(2, 8, 7, 5, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape
    y.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


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
