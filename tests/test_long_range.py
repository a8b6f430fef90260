"""The long-range predictors (score_pool, centered, double_centered, its gated form, median_polished, score_gap,
median_gap, offset_corr) and the models registered on them."""

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import weightformer  # noqa: F401
from weightformer.layers import (
    DWCONV_PREDICTORS,
    LINEAR_PREDICTORS,
    DynamicDWConv,
    DynamicLinear,
)
from weightformer.layers.long_range_predictors import (
    BilateralUnitPredictor,
    CenteredPredictor,
    DoubleCenteredPredictor,
    GatedDoubleCenteredPredictor,
    MedianGapKernelPredictor,
    MedianPolishedPredictor,
    OffsetCorrelationKernelPredictor,
    ScorePoolKernelPredictor,
    ScorePoolPredictor,
    StaticLedGatedPredictor,
)


def _randomise(module: torch.nn.Module) -> None:
    torch.manual_seed(1)
    for p in module.parameters():
        p.data.normal_(0, 0.3)


def _lift(predictor, core: torch.Tensor) -> torch.Tensor:
    """ΔWᵀ = (g·U_inᵀ·unit(core)·U_out)ᵀ, written out; unit() divides by (root mean square + 1e-6)."""
    unit = core / (core.pow(2).mean(dim=(1, 2), keepdim=True).sqrt() + 1e-6)
    return predictor.gain * torch.einsum("ic,bij,jo->boc", predictor.in_basis, unit, predictor.out_basis)


def test_score_pool_matches_a_token_by_token_restatement():
    predictor = ScorePoolPredictor(32, 64)
    _randomise(predictor)
    x = torch.randn(2, 6, 4, 32)
    # pooled tokens, per-head softmax over them, each head owning a quarter of the input-rank rows
    pooled = x.view(2, 3, 2, 2, 2, 32).mean(dim=(2, 4)).reshape(2, 6, 32)
    p = F.silu(pooled @ predictor.proj.weight.T + predictor.proj.bias)
    p_in, p_out = p[..., :8], p[..., 8:]
    alpha = torch.softmax(pooled @ predictor.score.weight.T + predictor.score.bias, dim=1)  # (B, N', 4)
    core = torch.zeros(2, 8, 16)
    for b in range(2):
        for t in range(6):
            for row in range(8):
                core[b, row] += alpha[b, t, row // 2] * p_in[b, t, row] * p_out[b, t]
    torch.testing.assert_close(predictor(x), _lift(predictor, core), rtol=1e-4, atol=1e-6)


def test_bilateral_unit_is_the_released_sum_at_unit_scale():
    predictor = BilateralUnitPredictor(32, 64)
    _randomise(predictor)
    x = torch.randn(2, 4, 4, 32)
    pooled = F.avg_pool2d(x.permute(0, 3, 1, 2), 2).flatten(2).transpose(1, 2)
    p = F.silu(pooled @ predictor.proj.weight.T + predictor.proj.bias)
    core = torch.einsum("bti,btj->bij", p[..., :8], p[..., 8:])
    torch.testing.assert_close(predictor(x), _lift(predictor, core), rtol=1e-4, atol=1e-6)


def test_unit_predictors_start_with_weight_updates_of_a_useful_size():
    """At the released init, bilateral's ΔW columns are ~1e-5 long; the unit-scaled ones start near 0.3."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 6, 64)
    for cls in (BilateralUnitPredictor, ScorePoolPredictor, CenteredPredictor):
        norm = torch.linalg.vector_norm(cls(64, 256)(x), dim=-1).mean().item()
        assert 0.15 < norm < 0.6, (cls.__name__, norm)
    assert torch.linalg.vector_norm(LINEAR_PREDICTORS["bilateral"](64, 256)(x), dim=-1).mean() < 1e-3


def test_centered_is_the_covariance_of_the_activated_projections():
    predictor = CenteredPredictor(32, 32)
    _randomise(predictor)
    x = torch.randn(3, 4, 4, 32)
    pooled = F.avg_pool2d(x.permute(0, 3, 1, 2), 2).flatten(2).transpose(1, 2)  # (B, 4, C)
    p = F.silu(predictor.proj(pooled))
    covariance = torch.stack([torch.cov(sample.T, correction=0) for sample in p])  # (B, 16, 16)
    core = covariance[:, :8, 8:] * 4  # Σ over the 4 pooled tokens (the unit scaling removes the factor anyway)
    torch.testing.assert_close(predictor(x), _lift(predictor, core), rtol=1e-4, atol=1e-6)
    # a token grid with every token the same has no spread: ΔW = 0
    assert predictor(x[:, :1, :1].expand(3, 4, 4, 32)).abs().max() < 1e-7


def _activated_grid(predictor, x: torch.Tensor) -> torch.Tensor:
    """σ(P) on the 2x2-pooled grid, written out: (B, H, W, C) -> (B, C/r + O/r, H/2, W/2)."""
    pooled = F.avg_pool2d(x.permute(0, 3, 1, 2), 2)
    return F.silu(torch.einsum("oc,bchw->bohw", predictor.proj.weight, pooled) + predictor.proj.bias[:, None, None])


def _numpy_median_polish(grid: torch.Tensor) -> torch.Tensor:
    """One pass of median polish over the last two axes (rows, then columns) in numpy, float64."""
    values = grid.detach().double().numpy()
    values = values - np.median(values, axis=-1, keepdims=True)  # each row's median
    values = values - np.median(values, axis=-2, keepdims=True)  # then each column's
    return torch.from_numpy(values).float()


def test_double_centered_is_the_covariance_of_the_two_way_residuals():
    """Against centring matrices J_n = I - 11ᵀ/n applied to the pooled grid's rows and columns."""
    predictor = DoubleCenteredPredictor(32, 32)
    _randomise(predictor)
    x = torch.randn(3, 6, 8, 32)  # pools to a 3x4 grid
    p = _activated_grid(predictor, x)  # (B, 16, 3, 4)
    J3, J4 = torch.eye(3) - 1 / 3, torch.eye(4) - 1 / 4
    residual = torch.einsum("hk,bokl,wl->bohw", J3, p, J4).flatten(2)  # (B, 16, 12)
    core = torch.einsum("bit,bjt->bij", residual[:, :8], residual[:, 8:])
    torch.testing.assert_close(predictor(x), _lift(predictor, core), rtol=1e-4, atol=1e-6)


def test_gated_double_centered_scales_the_two_way_covariance_by_an_exponential_gain():
    """ΔW = g₀·exp(30·s)·U_inᵀ·unit(core)·U_out with the double-centred core written out as above; s starts at 0,
    so the gated predictor starts where double_centered does, and g₀ depends only on the shapes."""
    predictor = GatedDoubleCenteredPredictor(32, 32)
    assert float(predictor.gain) == 0.0
    torch.manual_seed(0)
    plain = DoubleCenteredPredictor(32, 32)
    assert predictor.start == pytest.approx(float(plain.gain))  # g₀ = 0.3 / (0.02² · √(8 · 8 · 32))
    _randomise(predictor)
    predictor.gain.data.fill_(-0.05)  # g = g₀·exp(-1.5), far from g₀
    x = torch.randn(3, 6, 8, 32)
    p = _activated_grid(predictor, x)
    J3, J4 = torch.eye(3) - 1 / 3, torch.eye(4) - 1 / 4
    residual = torch.einsum("hk,bokl,wl->bohw", J3, p, J4).flatten(2)
    core = torch.einsum("bit,bjt->bij", residual[:, :8], residual[:, 8:])
    unit = core / (core.pow(2).mean(dim=(1, 2), keepdim=True).sqrt() + 1e-6)
    gain = 0.3 / (0.02**2 * (8 * 8 * 32) ** 0.5) * torch.exp(30 * predictor.gain)
    expected = gain * torch.einsum("ic,bij,jo->boc", predictor.in_basis, unit, predictor.out_basis)
    torch.testing.assert_close(predictor(x), expected, rtol=1e-4, atol=1e-6)


def test_one_adam_step_moves_the_gated_gain_by_a_factor_and_the_plain_one_by_a_hair():
    """What the log scale is for: a step of Adam (lr 1e-3) changes s by about 1e-3, which multiplies the gated gain
    by exp(±0.03), where the plain gain (about 3 at 64-d) changes by 1e-3 of 3."""
    x = torch.randn(2, 8, 8, 64)
    for cls, low, high in ((GatedDoubleCenteredPredictor, 0.02, 0.04), (DoubleCenteredPredictor, 1e-4, 1e-3)):
        torch.manual_seed(0)
        predictor = cls(64, 256)
        optimizer = torch.optim.Adam([predictor.gain], lr=1e-3)
        before = float(predictor.current_gain())
        predictor(x).square().sum().backward()  # any loss: Adam's first step is lr times the gradient's sign
        optimizer.step()
        change = abs(float(predictor.current_gain()) / before - 1)
        assert low < change < high, (cls.__name__, change)


def test_static_led_gated_starts_at_a_tenth_of_the_gated_predictor_in_a_built_model():
    """Same draws, s from ln(0.1)/30 instead of 0: ΔW a tenth of the gated predictor's, in the layer alone and in
    every block of a built model (whose init resets each predictor's parameters after construction)."""
    x = torch.randn(2, 6, 8, 32)
    torch.manual_seed(0)
    gated = GatedDoubleCenteredPredictor(32, 64)
    torch.manual_seed(0)
    led = StaticLedGatedPredictor(32, 64)
    torch.testing.assert_close(led(x), 0.1 * gated(x), rtol=1e-5, atol=1e-8)
    led.gain.data.fill_(0.5)
    led.reset_parameters()
    assert float(led.current_gain()) == pytest.approx(0.1 * led.start, rel=1e-5)
    model = timm.create_model("weightformer_long_range_tiny", img_size=32, num_classes=3, depth=3,
                              linear_predictor="double_centered_gated_led")
    gains = [m.current_gain() / m.start for m in model.modules() if isinstance(m, StaticLedGatedPredictor)]
    assert len(gains) == 3 and all(float(g) == pytest.approx(0.1, rel=1e-5) for g in gains)


def test_gated_double_centered_scripts_and_matches_eager():
    model = timm.create_model("weightformer_long_range_tiny", img_size=32, num_classes=3, depth=2,
                              linear_predictor="double_centered_gated", dwc_dynamic_period=3).eval()
    _randomise(model)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(model)(x), model(x))


def test_double_centered_ignores_what_varies_only_along_rows_or_columns():
    """A grid whose tokens depend on the row alone (or the column alone), like the border of a zero-padded conv
    along one edge over a uniform background: no update, where ``centered`` predicts one."""
    torch.manual_seed(0)
    by_row = torch.randn(2, 8, 1, 32).expand(2, 8, 8, 32)
    by_col = torch.randn(2, 1, 8, 32).expand(2, 8, 8, 32)
    double, plain = DoubleCenteredPredictor(32, 64), CenteredPredictor(32, 64)
    plain.load_state_dict(double.state_dict())
    for x in (by_row, by_col):
        assert double(x).abs().max() < 1e-6
        assert plain(x).abs().max() > 1e-3
    one_token = torch.zeros(2, 8, 8, 32)
    one_token[:, 4:6, 2:4] = torch.randn(2, 1, 1, 32)  # one pooled token differs: an update again
    assert double(one_token).abs().max() > 1e-3


def test_median_polished_is_the_product_of_the_median_polish_residuals():
    """Against numpy's medians on an odd grid (3x5, where every median is one element), token by token."""
    predictor = MedianPolishedPredictor(32, 32)
    _randomise(predictor)
    x = torch.randn(2, 6, 10, 32)  # pools to a 3x5 grid
    residual = _numpy_median_polish(_activated_grid(predictor, x)).flatten(2)  # (B, 16, 15) from a 3x5 grid
    core = torch.einsum("bit,bjt->bij", residual[:, :8], residual[:, 8:])
    torch.testing.assert_close(predictor(x), _lift(predictor, core), rtol=1e-4, atol=1e-6)


def _on_a_larger_canvas(x: torch.Tensor, background: torch.Tensor, side: int, top: int, left: int) -> torch.Tensor:
    canvas = background.expand(x.shape[0], side, side, x.shape[-1]).clone()
    canvas[:, top:top + x.shape[1], left:left + x.shape[2]] = x
    return canvas


def test_median_polished_is_unchanged_by_background_added_around_sparse_content():
    """Two objects on a uniform background, then the same tokens on a canvas of twice the side (centred, and in a
    corner): with medians ΔW is the same, with means (double_centered) it changes with the background's share."""
    torch.manual_seed(0)
    background = torch.randn(1, 1, 1, 32)
    x = background.expand(2, 16, 16, 32).clone()
    x[:, 4:6, 2:4] += 2 * torch.randn(2, 1, 1, 32)
    x[:, 10:12, 12:14] += 2 * torch.randn(2, 1, 1, 32)
    median, mean = MedianPolishedPredictor(32, 64), DoubleCenteredPredictor(32, 64)
    mean.load_state_dict(median.state_dict())
    for top, left in ((8, 8), (0, 16)):  # on 2x2-pooling boundaries, so the pooled tokens are the same
        larger = _on_a_larger_canvas(x, background, 32, top, left)
        torch.testing.assert_close(median(larger), median(x), rtol=1e-4, atol=1e-6)
        assert (mean(larger) - mean(x)).abs().max() > 1e-3 * mean(x).abs().max()


def test_median_polished_ignores_what_varies_only_along_rows_or_columns():
    torch.manual_seed(0)
    predictor = MedianPolishedPredictor(32, 64)
    for x in (torch.randn(2, 8, 1, 32).expand(2, 8, 8, 32), torch.randn(2, 1, 8, 32).expand(2, 8, 8, 32)):
        assert predictor(x).abs().max() < 1e-6


def test_median_gap_is_the_unit_sum_of_the_median_polish_residuals():
    predictor = MedianGapKernelPredictor(8, 3)
    _randomise(predictor)
    x = torch.randn(2, 8, 5, 7)
    z = _numpy_median_polish(x).sum(dim=(2, 3))  # (B, C)
    z = z / (z.pow(2).mean(dim=1, keepdim=True).sqrt() + 1e-6)
    expected = F.gelu(z @ predictor.fc1.weight.T + predictor.fc1.bias)[:, :, None, None] * predictor.bank
    torch.testing.assert_close(predictor(x), expected, rtol=1e-4, atol=1e-6)


def _assert_finite_gradients_on_blank(predictor: str, background: torch.Tensor) -> None:
    """A dynamic conv with ``predictor`` on an all-background input (1, 1, 1, C): finite gradients everywhere."""
    channels = background.shape[-1]
    layer = DynamicDWConv(channels, 3, predictor=predictor)
    blank = background.permute(0, 3, 1, 2).expand(1, channels, 6, 6).clone().requires_grad_()
    layer(blank).square().sum().backward()
    assert torch.isfinite(blank.grad).all() and all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_median_gap_is_unchanged_by_background_added_around_sparse_content():
    """Where the release's region-by-region kernel and the global mean both change with the canvas."""
    torch.manual_seed(0)
    background = torch.randn(1, 1, 1, 16)
    x = background.expand(2, 12, 12, 16).clone()
    x[:, 3:5, 2:4] += 2 * torch.randn(2, 1, 1, 16)
    x[:, 8, 9] += 2 * torch.randn(2, 16)
    larger = _on_a_larger_canvas(x, background, 24, 5, 7).permute(0, 3, 1, 2)
    x = x.permute(0, 3, 1, 2)
    median = MedianGapKernelPredictor(16, 3)
    torch.testing.assert_close(median(larger), median(x), rtol=1e-5, atol=1e-7)
    for name in ("adaptive", "gap"):
        other = DWCONV_PREDICTORS[name](16, 3)
        assert (other(larger) - other(x)).abs().max() > 1e-3 * other(x).abs().max(), name
    _assert_finite_gradients_on_blank("median_gap", background)  # z = 0 there


@pytest.mark.parametrize("predictors", [{"linear_predictor": "median_polished", "dwc_predictor": "median_gap"},
                                        {"dwc_predictor": "offset_corr"}])
def test_median_predictors_script_and_match_eager(predictors):
    """TorchScript, as timm's suite scripts every registered model, with the median-polishing predictors in
    every block."""
    model = timm.create_model("weightformer_long_range_tiny", img_size=32, num_classes=3, depth=2,
                              **predictors).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.script(model)(x), model(x))


def _numpy_offset_correlation(m: torch.Tensor, k: int) -> np.ndarray:
    """A[b, c, i, j] = Σ_p m[p]·SiLU(m[p + (i − r, j − r)]) over the positions whose neighbour is inside, float64."""
    values = m.detach().double().numpy()
    silu = values / (1 + np.exp(-values))
    B, C, H, W = values.shape
    r = k // 2
    out = np.zeros((B, C, k, k))
    for i in range(k):
        for j in range(k):
            for y in range(H):
                for x in range(W):
                    ny, nx = y + i - r, x + j - r
                    if 0 <= ny < H and 0 <= nx < W:
                        out[:, :, i, j] += values[:, :, y, x] * silu[:, :, ny, nx]
    return out


def test_offset_corr_reads_the_offset_correlation_of_the_median_polish_residuals():
    """Against numpy on an odd grid (every median one element) with a 5×5 kernel, where the taps are not
    symmetric: A(d) ≠ A(−d)."""
    predictor = OffsetCorrelationKernelPredictor(8, 5)
    _randomise(predictor)
    x = torch.randn(2, 8, 5, 7)
    a = torch.from_numpy(_numpy_offset_correlation(_numpy_median_polish(x), 5)).float()  # (B, C, 5, 5)
    assert (a - a.flip(-1, -2)).abs().max() > 0.1  # not centrosymmetric
    a = a / (a.pow(2).mean(dim=(1, 2, 3), keepdim=True).sqrt() + 1e-6)
    hidden = F.gelu(torch.einsum("oc,bcij->boij", predictor.fc1.weight[:, :, 0, 0], a)
                    + predictor.fc1.bias[:, None, None])
    expected = torch.einsum("oc,bcij->boij", predictor.fc2.weight[:, :, 0, 0], hidden)
    torch.testing.assert_close(predictor(x), expected, rtol=1e-4, atol=1e-5)


def test_offset_corr_is_unchanged_by_background_added_around_sparse_content():
    """A stroke and a dot on a uniform background, then on a canvas of twice the side (centred, and in a corner):
    the kernel is the same, where the release's region-by-region kernel changes."""
    torch.manual_seed(0)
    background = torch.randn(1, 1, 1, 16)
    x = background.expand(2, 12, 12, 16).clone()
    x[:, 3, 2:7] += 2 * torch.randn(2, 1, 16)  # a horizontal stroke, five tokens long
    x[:, 8, 9] += 2 * torch.randn(2, 16)
    predictor, adaptive = OffsetCorrelationKernelPredictor(16, 3), DWCONV_PREDICTORS["adaptive"](16, 3)
    for top, left in ((6, 6), (0, 12)):
        larger = _on_a_larger_canvas(x, background, 24, top, left).permute(0, 3, 1, 2)
        small = x.permute(0, 3, 1, 2)
        torch.testing.assert_close(predictor(larger), predictor(small), rtol=1e-4, atol=1e-6)
        assert (adaptive(larger) - adaptive(small)).abs().max() > 1e-3 * adaptive(small).abs().max()
    _assert_finite_gradients_on_blank("offset_corr", background)  # A = 0 there


def test_score_gap_pools_each_channel_with_its_own_softmax():
    predictor = ScorePoolKernelPredictor(8, 3)
    _randomise(predictor)
    x = torch.randn(2, 8, 5, 5)
    scores = torch.einsum("oc,bchw->bohw", predictor.score.weight[:, :, 0, 0], x) + predictor.score.bias[:, None, None]
    weights = torch.softmax(scores.flatten(2), -1)
    pooled = (weights * x.flatten(2)).sum(-1)
    expected = F.gelu(pooled @ predictor.fc1.weight.T + predictor.fc1.bias)[:, :, None, None] * predictor.bank
    torch.testing.assert_close(predictor(x), expected, rtol=1e-4, atol=1e-6)


def test_new_names_are_in_the_registries_and_layers_build_with_them():
    assert LINEAR_PREDICTORS["score_pool"] is ScorePoolPredictor and LINEAR_PREDICTORS["centered"] is CenteredPredictor
    assert LINEAR_PREDICTORS["bilateral_unit"] is BilateralUnitPredictor
    assert DWCONV_PREDICTORS["score_gap"] is ScorePoolKernelPredictor
    assert DWCONV_PREDICTORS["median_gap"] is MedianGapKernelPredictor
    assert DWCONV_PREDICTORS["offset_corr"] is OffsetCorrelationKernelPredictor
    x = torch.randn(2, 5, 3, 32)  # odd grid side
    assert LINEAR_PREDICTORS["double_centered"] is DoubleCenteredPredictor
    assert LINEAR_PREDICTORS["median_polished"] is MedianPolishedPredictor
    assert LINEAR_PREDICTORS["double_centered_gated"] is GatedDoubleCenteredPredictor
    assert LINEAR_PREDICTORS["double_centered_gated_led"] is StaticLedGatedPredictor
    for name in ("score_pool", "centered", "double_centered", "double_centered_gated", "double_centered_gated_led",
                 "median_polished",
                 "bilateral_unit"):
        assert DynamicLinear(32, 128, predictor=name)(x).shape == (2, 5, 3, 128)
    for name in ("score_gap", "median_gap", "offset_corr"):
        assert DynamicDWConv(32, 5, predictor=name)(x.permute(0, 3, 1, 2)).shape == (2, 32, 5, 3)


def _predictor_flops(predictor: torch.nn.Module, x: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        predictor(x)
    return counter.get_total_flops()


@pytest.mark.parametrize("predictor", [ScorePoolPredictor(32, 128), CenteredPredictor(32, 128),
                                       DoubleCenteredPredictor(32, 128), MedianPolishedPredictor(32, 128),
                                       BilateralUnitPredictor(32, 128)])
def test_linear_predictor_cost_grows_linearly_with_the_token_count(predictor):
    flops = [_predictor_flops(predictor, torch.randn(1, side, side, 32)) for side in (8, 16, 32)]
    # the N-independent lift is the same at every size; the rest must grow 4x per doubling of the side, not 16x
    assert (flops[2] - flops[1]) / (flops[1] - flops[0]) == pytest.approx(4.0, rel=0.05)


def test_gradients_reach_every_new_predictor_parameter():
    model = timm.create_model("weightformer_tiny", patch_size=4, embed_dim=32, depth=2, dynamic_period=1, img_size=16,
                              num_classes=3, linear_predictor="score_pool", dwc_predictor="score_gap")
    _randomise(model)
    model(torch.randn(2, 3, 16, 16)).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        if ".predictor." in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_long_range_model_name_uses_double_centered_and_the_default_is_unchanged():
    long_range = timm.create_model("weightformer_long_range_tiny", img_size=32, num_classes=2)
    released = timm.create_model("weightformer_tiny", img_size=32, num_classes=2)
    assert all(block.mlp.fc1.predictor_name == "double_centered" for block in long_range.blocks)  # every block dynamic
    assert released.blocks[1].mlp.fc1.predictor_name == "bilateral"
    assert released.blocks[1].dwc.predictor_name == "adaptive" and not released.blocks[0].dynamic
    assert long_range(torch.randn(1, 3, 32, 32)).shape == (1, 2)
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("weightformer_long_range_tiny", pretrained=True)


@pytest.mark.parametrize("predictor, grid", [("centered", (3, 3)), ("double_centered", (3, 3)), ("double_centered", (2, 9)),
                                               ("median_polished", (3, 3)), ("median_polished", (2, 9))])
def test_centered_has_finite_gradients_when_its_core_is_zero(predictor, grid):
    """A 3x3 grid pools to one token, a 2x9 grid to one row: the centred core is exactly 0 and its gradient must
    stay finite."""
    layer = DynamicLinear(32, 64, predictor=predictor)
    x = torch.randn(2, *grid, 32, requires_grad=True)
    layer(x).square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)
    assert torch.isfinite(x.grad).all()
