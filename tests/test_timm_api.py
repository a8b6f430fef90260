"""timm's newest model API for the WeightFormer family (timm 1.0.31): device/dtype and meta builds, materialising
a meta-built model with ``to_empty()`` + ``init_weights()``, ``set_input_size``, the dynamic-size arguments,
timm's global pools and, for the isotropic ConvNeXt, ``features_only``."""

import pytest
import timm
import torch
from timm.layers import BlurPool2d
from timm.models._input import get_model_args, get_model_input_config
from torch import nn

import weightformer  # noqa: F401  (registers the models)
from weightformer.layers import DWCONV_PREDICTORS, LINEAR_PREDICTORS
from weightformer.models import ConvNeXtIsotropic, WeightFormer

FAMILY = ["weightformer_tiny", "weightformer_long_range_tiny", "convnext_isotropic_tiny"]
SMALL = dict(embed_dim=32, depth=4, num_classes=7)


def _poisoned(model: nn.Module) -> nn.Module:
    """NaN in every floating tensor, so that a value that init_weights() misses cannot pass by chance."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.is_floating_point():
                tensor.fill_(float("nan"))
    return model


def _materialised(build) -> nn.Module:
    """``build()`` on the meta device, then ``to_empty()`` on the CPU, poisoned, and ``init_weights()``."""
    with torch.device("meta"):
        model = build()
    assert all(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    model = _poisoned(model.to_empty(device="cpu"))
    model.init_weights()
    return model.eval()


def _assert_same_state(expected: nn.Module, actual: nn.Module) -> None:
    expected_state, actual_state = expected.state_dict(), actual.state_dict()
    assert list(expected_state) == list(actual_state)
    differ = [k for k, v in expected_state.items() if not torch.equal(v, actual_state[k])]
    assert not differ, f"parameters or buffers differ from a directly built model: {differ[:5]}"


# -------------------------------------------------------------------------------------------------
# device / dtype, meta builds, cfgs
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILY)
def test_device_and_dtype_kwargs_and_the_meta_device_context(name):
    model = timm.create_model(name, device="meta", dtype=torch.float64)
    assert all(p.device.type == "meta" and p.dtype == torch.float64 for p in model.parameters())
    with torch.device("meta"):
        model = timm.create_model(name)
    assert all(p.device.type == "meta" for p in model.parameters())
    model.reset_classifier(3)  # the new head follows the model's device and dtype
    assert all(p.device.type == "meta" for p in model.get_classifier().parameters())


@pytest.mark.parametrize("name", ["weightformer_tiny", "weightformer_small", "weightformer_base"])
def test_pretrained_cfgs_carry_the_license(name):
    assert timm.create_model(name, device="meta").pretrained_cfg["license"] == "mit"


# -------------------------------------------------------------------------------------------------
# to_empty() + init_weights()
# -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FAMILY)
def test_a_meta_built_model_materialises_to_the_directly_built_one(name):
    torch.manual_seed(0)
    direct = timm.create_model(name).eval()
    torch.manual_seed(0)
    materialised = _materialised(lambda: timm.create_model(name))
    _assert_same_state(direct, materialised)
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(materialised(x), direct(x), rtol=0, atol=0)


@pytest.mark.parametrize(("kind", "predictor"), [("linear_predictor", name) for name in sorted(LINEAR_PREDICTORS)]
                         + [("dwc_predictor", name) for name in sorted(DWCONV_PREDICTORS)])
def test_every_predictor_is_reset_by_init_weights(kind, predictor):
    def build():
        return WeightFormer(**SMALL, dynamic_period=1, **{kind: predictor})

    torch.manual_seed(1)
    direct = build()
    torch.manual_seed(1)
    _assert_same_state(direct, _materialised(build))


def test_init_weights_draws_the_release_distributions():
    torch.manual_seed(0)
    model = _materialised(lambda: WeightFormer(embed_dim=192, depth=3, num_classes=1000))
    for tensor in (model.head.weight, model.blocks[1].mlp.fc1.weight, model.blocks[1].mlp.fc1.predictor.in_basis,
                   model.blocks[0].mlp.fc2.weight):  # truncated normal, std 0.02
        assert abs(tensor.std().item() - 0.02) < 0.002 and tensor.abs().max() <= 2.0
    assert torch.all(model.head.bias == 0) and torch.all(model.norm.weight == 1) and torch.all(model.norm.bias == 0)
    conv = model.patch_embed.proj.weight  # PyTorch's default conv init: uniform, bound 1/sqrt(fan_in)
    assert conv.abs().max() <= (3 * 16 * 16) ** -0.5 and conv.std() > 0.5 * (3 * 16 * 16) ** -0.5 / 3**0.5


def test_init_weights_without_reset_redraws_only_the_linears():
    model = WeightFormer(**SMALL, dynamic_period=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.init_weights(needs_reset=False)
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    linears = {f"{n}.weight" for n, m in model.named_modules() if type(m) is nn.Linear}
    assert changed == linears  # the biases stay zero; the dynamic layers, convs and norms are untouched


def test_init_weights_restores_non_persistent_buffers():
    """A submodule with timm's ``init_non_persistent_buffers()`` (here timm's BlurPool2d) gets its buffers back."""
    def build():
        model = WeightFormer(**SMALL)
        model.blur = BlurPool2d(channels=4)
        return model

    direct = build()
    materialised = _materialised(build)
    torch.testing.assert_close(materialised.blur.filt, direct.blur.filt, rtol=0, atol=0)


# -------------------------------------------------------------------------------------------------
# set_input_size, dynamic_img_size / dynamic_img_pad
# -------------------------------------------------------------------------------------------------
def test_set_input_size_updates_the_nominal_size_only():
    model = timm.create_model("weightformer_tiny").eval()
    x = torch.randn(1, 3, 80, 64)
    with torch.no_grad():
        before = model(x)
    model.set_input_size(img_size=(320, 288))
    embed = model.patch_embed
    assert embed.img_size == (320, 288) and embed.grid_size == (20, 18) and embed.num_patches == 360
    assert get_model_input_config(model)["input_size"] == (3, 320, 288)
    assert get_model_args(model)["img_size"] == (320, 288)  # what timm's Hub export rebuilds the model with
    assert model.pretrained_cfg["input_size"] == (3, 224, 224)  # the source checkpoint's, unchanged
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)


def test_set_input_size_to_a_new_patch_size():
    torch.manual_seed(0)
    model = WeightFormer(**SMALL).eval()
    model.requires_grad_(False)
    model.set_input_size(img_size=96, patch_size=8)
    assert model.patch_embed.proj.weight.shape == (32, 3, 8, 8) and model.patch_embed.grid_size == (12, 12)
    assert [info["reduction"] for info in model.feature_info] == [8] * 4
    assert not any(p.requires_grad for p in model.parameters())
    assert get_model_args(model)["patch_size"] == 8
    # Everything but the resampled projection is what a model built with patch 8 holds.
    built = WeightFormer(**SMALL, patch_size=8).eval()
    built.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 76, 60)  # not whole patches of 8: the crop follows the new patch size
    with torch.no_grad():
        assert model.forward_features(x).shape == (2, 9, 7, 32)
        torch.testing.assert_close(model(x), built(x), rtol=0, atol=0)
        intermediates = model.forward_intermediates(x, indices=1, intermediates_only=True)
    assert intermediates[0].shape == (2, 32, 9, 7)


@pytest.mark.parametrize("patch_size", [(8, 16), 0, 2.5])
def test_set_input_size_refuses_patches_that_are_not_square_positive_integers(patch_size):
    model = WeightFormer(**SMALL)
    with pytest.raises(ValueError, match="patch_size"):
        model.set_input_size(patch_size=patch_size)


def test_the_models_are_dynamic_size():
    model = timm.create_model("weightformer_tiny", dynamic_img_size=True)
    assert not get_model_input_config(model)["fixed_input_size"]
    with pytest.raises(ValueError, match="dynamic_img_size"):
        timm.create_model("weightformer_tiny", dynamic_img_size=False)


def test_dynamic_img_pad_pads_to_whole_patches_instead_of_cropping():
    torch.manual_seed(0)
    padding = WeightFormer(**SMALL, dynamic_img_pad=True).eval()
    cropping = WeightFormer(**SMALL).eval()
    cropping.load_state_dict(padding.state_dict())
    x = torch.randn(2, 3, 40, 20)
    canvas = torch.zeros(2, 3, 48, 32)  # the next whole patches of 16, zeros at the bottom and right
    canvas[:, :, :40, :20] = x
    with torch.no_grad():
        assert padding.forward_features(x).shape == (2, 3, 2, 32)
        torch.testing.assert_close(padding(x), cropping(canvas), rtol=0, atol=0)
        final, intermediates = padding.forward_intermediates(x, indices=1)
        torch.testing.assert_close(final, cropping.forward_features(canvas), rtol=0, atol=0)
        assert cropping.forward_features(x).shape == (2, 2, 1, 32)  # the default drops the partial patches
        assert padding(torch.randn(1, 3, 10, 7)).shape == (1, 7)  # smaller than a patch: one padded patch


# -------------------------------------------------------------------------------------------------
# global pools
# -------------------------------------------------------------------------------------------------
def _pooled_nhwc(feats, pool):  # (B, H, W, C) -> (B, C)
    rows = feats.reshape(feats.shape[0], -1, feats.shape[-1])
    mean, top = rows.sum(1) / rows.shape[1], rows.max(dim=1).values
    return {"avg": mean, "max": top, "avgmax": (mean + top) / 2}[pool]


@pytest.mark.parametrize("pool", ["avg", "max", "avgmax"])
def test_weightformer_global_pools(pool):
    torch.manual_seed(0)
    model = WeightFormer(**SMALL, global_pool=pool).eval()
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        feats = model.forward_features(x)
        pooled = model.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(pooled, _pooled_nhwc(feats, pool))
        torch.testing.assert_close(model(x), model.head(_pooled_nhwc(feats, pool)))
        model.reset_classifier(0, "")
        assert model(x).shape == (2, 4, 3, 32)
        model.reset_classifier(5, pool)
        assert model.global_pool == pool and model(x).shape == (2, 5)
        torch.testing.assert_close(model.forward_head(feats, pre_logits=True), _pooled_nhwc(feats, pool))


def _pooled_nchw(feats, pool):  # (B, C, H, W) -> (B, C)
    return _pooled_nhwc(feats.permute(0, 2, 3, 1), pool)


@pytest.mark.parametrize("pool", ["avg", "max", "avgmax"])
def test_convnext_isotropic_global_pools(pool):
    torch.manual_seed(0)
    model = ConvNeXtIsotropic(embed_dim=32, depth=2, num_classes=7, global_pool=pool).eval()
    x = torch.randn(2, 3, 64, 48)
    with torch.no_grad():
        feats = model.forward_features(x)
        pooled = model.forward_head(feats, pre_logits=True)
        torch.testing.assert_close(pooled, model.norm(_pooled_nchw(feats, pool)))
        model.reset_classifier(0, "")
        grid = model(x)  # (B, C, h, w): each position normalised
        torch.testing.assert_close(grid, model.norm(feats.permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        model.reset_classifier(5, pool)
        assert model.global_pool == pool and model(x).shape == (2, 5)


@pytest.mark.parametrize("cls", [WeightFormer, ConvNeXtIsotropic])
@pytest.mark.parametrize("pool, message", [("token", "class token"), ("catavgmax", "global_pool must be one of"),
                                           ("mean", "global_pool must be one of")])
def test_unsupported_global_pools_are_one_clear_error(cls, pool, message):
    with pytest.raises(ValueError, match=message):
        cls(embed_dim=32, depth=1, global_pool=pool)
    model = cls(embed_dim=32, depth=1, num_classes=3)
    with pytest.raises(ValueError, match=message):
        model.reset_classifier(4, pool)
    assert model.global_pool == "avg" and model.num_classes == 3  # left as it was


# -------------------------------------------------------------------------------------------------
# ConvNeXt isotropic: features_only
# -------------------------------------------------------------------------------------------------
def test_convnext_isotropic_features_only():
    model = timm.create_model("convnext_isotropic_tiny", features_only=True, out_indices=(2, 9, 16)).eval()
    assert model.feature_info.channels() == [192] * 3 and model.feature_info.reduction() == [16] * 3
    with torch.no_grad():
        feats = model(torch.randn(1, 3, 96, 64))
    assert [f.shape for f in feats] == [(1, 192, 6, 4)] * 3
