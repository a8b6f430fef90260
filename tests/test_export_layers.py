"""The traced forms of the dynamic layers (used while torch.compile / torch.export trace) compute what
the eager forms compute: each checked against an independent statement of the operation."""

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import weightformer  # noqa: F401  (registers the models)
from weightformer.layers import DynamicDWConv, DynamicLinear, dynamic_dwconv
from weightformer.layers.dynamic_dwconv import (
    DWCONV_PREDICTORS,
    adaptive_avg_pool_matrices,
    per_sample_depthwise_conv_taps,
)


def tracing(active: bool):
    """Make the layers believe torch.compile / torch.export is (or is not) tracing them."""
    return mock.patch("torch.compiler.is_compiling", return_value=active)


@pytest.mark.parametrize("size", [(1, 1), (2, 3), (7, 7), (13, 17), (14, 9), (3, 20)])
@pytest.mark.parametrize("bins", [1, 3, 5])
def test_pool_matrices_equal_adaptive_avg_pool(size, bins):
    x = torch.randn(2, 4, *size, dtype=torch.float64)
    # the bins spelled out by hand: bin i of a side n covers [floor(i n / k), ceil((i + 1) n / k))
    expected = torch.empty(2, 4, bins, bins, dtype=torch.float64)
    for i in range(bins):
        for j in range(bins):
            h0, h1 = (i * size[0]) // bins, -(-((i + 1) * size[0]) // bins)
            w0, w1 = (j * size[1]) // bins, -(-((j + 1) * size[1]) // bins)
            expected[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(dim=(2, 3))
    torch.testing.assert_close(adaptive_avg_pool_matrices(x, bins), expected)
    torch.testing.assert_close(F.adaptive_avg_pool2d(x, bins), expected)


@pytest.mark.parametrize("kernel_size", [1, 3, 5])
@pytest.mark.parametrize("size", [(5, 5), (4, 7), (1, 3)])
def test_taps_equal_one_conv_per_sample(kernel_size, size):
    B, C = 3, 4
    x = torch.randn(B, *size, C, dtype=torch.float64).permute(0, 3, 1, 2)  # channels-last, as in the blocks
    kernel = torch.randn(B, C, kernel_size, kernel_size, dtype=torch.float64)
    bias = torch.randn(C, dtype=torch.float64)
    expected = torch.cat([F.conv2d(x[b:b + 1], kernel[b][:, None], bias, padding=kernel_size // 2, groups=C)
                          for b in range(B)])
    torch.testing.assert_close(per_sample_depthwise_conv_taps(x, kernel, bias), expected)


@pytest.mark.parametrize("static_led, padding", [(False, "zeros"), (True, "zeros"), (True, "background")])
@pytest.mark.parametrize("predictor", sorted(DWCONV_PREDICTORS))
def test_dwconv_traced_form_equals_eager(predictor, static_led, padding):
    torch.manual_seed(0)
    layer = DynamicDWConv(8, 3, predictor=predictor, static_led=static_led, padding=padding).double()
    x = torch.randn(2, 11, 6, 8, dtype=torch.float64).permute(0, 3, 1, 2)
    with tracing(False):
        eager = layer(x)
    taps = mock.patch.object(dynamic_dwconv, "per_sample_depthwise_conv_taps", wraps=per_sample_depthwise_conv_taps)
    pool = mock.patch.object(dynamic_dwconv, "adaptive_avg_pool_matrices", wraps=adaptive_avg_pool_matrices)
    with tracing(True), taps as taps_spy, pool as pool_spy:
        traced = layer(x)
    assert taps_spy.called  # the traced form really ran
    if predictor in ("adaptive", "amp_dir", "conv"):  # the predictors that pool to K×K
        assert pool_spy.called
    torch.testing.assert_close(traced, eager)


def test_linear_unchanged_under_tracing():
    torch.manual_seed(0)
    layer = DynamicLinear(8, 16).double()
    x = torch.randn(2, 5, 7, 8, dtype=torch.float64)
    with tracing(False):
        eager = layer(x)
    with tracing(True):
        traced = layer(x)
    torch.testing.assert_close(traced, eager)


def test_model_traced_forms_equal_eager_at_odd_grids():
    torch.manual_seed(0)
    import timm

    model = timm.create_model("weightformer_tiny", embed_dim=32, depth=3, num_classes=5).eval()
    for shape in [(2, 3, 208, 272), (1, 3, 48, 80)]:
        x = torch.randn(*shape)
        with torch.no_grad(), tracing(False):
            eager = model(x)
        with torch.no_grad(), tracing(True):
            traced = model(x)
        torch.testing.assert_close(traced, eager, atol=1e-5, rtol=1e-5)


def _traced_at(model, side):
    """torch.export straight (not through export_program, which refuses small examples)."""
    from torch.export import Dim

    with torch.no_grad():
        return torch.export.export(model, (torch.randn(2, 3, side, side),),
                                   dynamic_shapes=({0: Dim.AUTO, 2: Dim.AUTO, 3: Dim.AUTO},)).module()


@pytest.mark.parametrize("dynamic_period, least", [(3, 16), (0, 8)])
def test_the_smallest_export_example_is_the_grid_tracers_keep_dynamic(dynamic_period, least):
    """min_export_side, the floor export puts under --img-size: below it torch.export bakes in the small
    grid (a side of 1 for any model; the 2x2-pooled grid of 1 for the dynamic layers) and the program
    refuses every other size; at the floor it takes them."""
    import timm

    from weightformer.export.sizes import min_export_side

    torch.manual_seed(0)
    model = timm.create_model("weightformer_tiny", patch_size=4, embed_dim=32, depth=2, num_classes=3,
                              dynamic_period=dynamic_period).eval()
    assert min_export_side(model) == least
    other = torch.randn(1, 3, 40, 36)
    with pytest.raises(Exception, match="Guard failed"):
        _traced_at(model, least - 4)(other)
    with torch.no_grad():
        torch.testing.assert_close(_traced_at(model, least)(other), model(other), atol=1e-5, rtol=1e-5)
