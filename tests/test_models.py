"""WeightFormer models: structure of the release, timm's API, any input size, numerical health."""

from functools import partial

import pytest
import timm
import torch
from torch import nn

import weightformer  # noqa: F401  (registers the models)
from weightformer.layers import DynamicDWConv, DynamicLinear
from weightformer.layers.dynamic_dwconv import BackgroundPaddedConv2d
from weightformer.models import WeightFormer, is_dynamic_block

SMALL = dict(embed_dim=32, depth=4, num_classes=7)


def small_model(**kwargs) -> WeightFormer:
    torch.manual_seed(0)
    return WeightFormer(**{**SMALL, **kwargs}).eval()


@pytest.mark.parametrize(
    "name, params",
    [("weightformer_tiny", 7_074_184), ("weightformer_small", 27_492_136), ("weightformer_base", 27_492_136)],
)
def test_parameter_counts_match_the_release(name, params):
    model = timm.create_model(name, device="meta")
    assert sum(p.numel() for p in model.parameters()) == params  # T 7.07M, S/B 27.49M


def test_registered_variants_and_pretrained_cfgs():
    assert {"weightformer_tiny", "weightformer_small", "weightformer_base"} <= set(timm.list_models("weightformer*"))
    for name, dim, size, hub in [
        ("weightformer_tiny", 192, 224, "RuizeHe/weightformer-t"),
        ("weightformer_small", 384, 224, "RuizeHe/weightformer-s"),
        ("weightformer_base", 384, 448, "RuizeHe/weightformer-b"),
    ]:
        model = timm.create_model(name, device="meta")
        cfg = model.pretrained_cfg
        assert model.embed_dim == dim and len(model.blocks) == 17
        assert cfg["input_size"] == (3, size, size) and cfg["pool_size"] == (size // 16, size // 16)
        assert cfg["hf_hub_id"] == hub
        assert cfg["mean"] == timm.data.IMAGENET_DEFAULT_MEAN and cfg["std"] == timm.data.IMAGENET_DEFAULT_STD
        assert cfg["interpolation"] == "bicubic" and cfg["crop_pct"] == 0.875
        assert cfg["first_conv"] == "patch_embed.proj" and cfg["classifier"] == "head"


def test_dynamic_blocks_every_third_from_index_one():
    model = timm.create_model("weightformer_tiny", device="meta")
    dynamic = [i for i, blk in enumerate(model.blocks) if isinstance(blk.dwc, DynamicDWConv)]
    assert dynamic == [1, 4, 7, 10, 13, 16]
    for i, blk in enumerate(model.blocks):
        assert isinstance(blk.mlp.fc1, DynamicLinear) == (i in dynamic)
        assert isinstance(blk.norm_stream, torch.nn.LayerNorm) == (i in dynamic)


@pytest.mark.parametrize("period, expected", [(1, [0, 1, 2, 3, 4]), (0, []), (2, [0, 2, 4]), (3, [1, 4])])
def test_dynamic_period_ablation(period, expected):
    assert [i for i in range(5) if is_dynamic_block(i, period)] == expected
    model = WeightFormer(embed_dim=32, depth=5, dynamic_period=period, device="meta")
    assert [i for i, b in enumerate(model.blocks) if b.dynamic] == expected


@pytest.mark.parametrize("period, dwc_period, convs", [(1, 3, [1, 4]), (1, 0, []), (3, 6, [4]), (1, None, [0, 1, 2, 3, 4])])
def test_dwc_dynamic_period_makes_the_other_dynamic_blocks_convs_static(period, dwc_period, convs):
    model = WeightFormer(embed_dim=32, depth=5, dynamic_period=period, dwc_dynamic_period=dwc_period, device="meta")
    assert [i for i, b in enumerate(model.blocks) if isinstance(b.dwc, DynamicDWConv)] == convs
    for i, block in enumerate(model.blocks):  # the MLP and the stream's norm follow dynamic_period alone
        assert isinstance(block.mlp.fc1, DynamicLinear) == is_dynamic_block(i, period)
        assert isinstance(block.norm_stream, nn.LayerNorm) == is_dynamic_block(i, period)
        if i not in convs:  # a static conv is the static blocks' own: depthwise 3x3 with a bias
            assert type(block.dwc) is nn.Conv2d and block.dwc.groups == 32 and block.dwc.bias is not None


def test_dwc_dynamic_period_runs_both_paths_alike():
    model = small_model(dynamic_period=1, dwc_dynamic_period=3)
    x = torch.randn(2, 3, 64, 80)
    with torch.inference_mode():  # each block's in-place inference path
        fast = model(x)
    plain = model(x)  # gradients recorded: each block's forward
    torch.testing.assert_close(fast, plain.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dwc_period, message", [(2, "makes the conv of a static block dynamic"),
                                                 (-1, "must be an int >= 0"), (True, "must be an int >= 0")])
def test_dwc_dynamic_period_refuses_what_it_cannot_build(dwc_period, message):
    with pytest.raises(ValueError, match=message):
        WeightFormer(embed_dim=32, depth=5, dynamic_period=3, dwc_dynamic_period=dwc_period, device="meta")


def test_dwc_static_led_reaches_every_dynamic_conv_and_only_those():
    model = WeightFormer(embed_dim=32, depth=5, dynamic_period=1, dwc_dynamic_period=3, dwc_static_led=True,
                         device="meta")
    dynamic = [b.dwc for b in model.blocks if isinstance(b.dwc, DynamicDWConv)]
    assert len(dynamic) == 2 and all(conv.static_led and conv.delta_scale == 0.1 for conv in dynamic)
    released = WeightFormer(embed_dim=32, depth=5, device="meta")
    assert not any(b.dwc.static_led for b in released.blocks if isinstance(b.dwc, DynamicDWConv))


def test_dwc_padding_reaches_every_depthwise_conv_and_keeps_the_checkpoint_keys():
    model = WeightFormer(embed_dim=32, depth=5, dwc_padding="background", device="meta")
    assert all(b.dwc.padding == "background" if isinstance(b.dwc, DynamicDWConv)
               else type(b.dwc) is BackgroundPaddedConv2d for b in model.blocks)
    released = WeightFormer(embed_dim=32, depth=5, device="meta")
    assert all(type(b.dwc) is torch.nn.Conv2d for b in released.blocks if not isinstance(b.dwc, DynamicDWConv))
    assert list(model.state_dict()) == list(released.state_dict())
    with pytest.raises(ValueError, match="dwc_padding must be one of zeros, background, got 'same'"):
        WeightFormer(embed_dim=32, depth=5, dwc_padding="same", device="meta")


def test_background_padding_hides_the_canvas_edge_from_the_first_block():
    """A drawing in the edge token column, and the same drawing two tokens in (one cell of the 2×2-pooled grid):
    under background padding the first block computes the same features at the drawing; under zero padding not."""
    image = torch.zeros(1, 3, 64, 64)
    glyph = torch.rand(3, 8, 6, generator=torch.Generator().manual_seed(0))
    at_edge, inside = image.clone(), image.clone()
    at_edge[0, :, 20:28, 0:6], inside[0, :, 20:28, 8:14] = glyph, glyph
    for padding, same in (("background", True), ("zeros", False)):
        torch.manual_seed(0)
        model = timm.create_model("weightformer_long_range_tiny", patch_size=4, embed_dim=32, depth=2, num_classes=2,
                                  linear_predictor="double_centered_gated_led", dwc_predictor="offset_corr",
                                  dwc_static_led=True, dwc_padding=padding).eval()
        with torch.no_grad():
            a, b = (model.forward_intermediates(x, indices=[0], intermediates_only=True)[0] for x in (at_edge, inside))
        # (1, C, 16, 16): the drawing's token columns 0-1 at the edge, 2-3 inside, and one column of halo each side.
        # Every token differs by ~2e-4 under either padding (ΔW, summed over the grid, misses the edge drawing's
        # halo column beyond the edge; float64 alike); the zero padding's edge tokens by ~1.
        assert torch.allclose(a[..., 0:3], b[..., 2:5], atol=1e-3) is same


@pytest.mark.parametrize("period, start, linears", [(1, 2, [2, 3, 4]), (1, 0, [0, 1, 2, 3, 4]), (3, 2, [4]),
                                                   (1, 5, [])])
def test_dynamic_linear_start_keeps_the_earlier_blocks_fc1_static(period, start, linears):
    model = WeightFormer(embed_dim=32, depth=5, dynamic_period=period, dwc_dynamic_period=3 if period == 1 else None,
                         dynamic_linear_start=start, device="meta")
    assert [i for i, b in enumerate(model.blocks) if isinstance(b.mlp.fc1, DynamicLinear)] == linears
    for i, block in enumerate(model.blocks):  # the conv and the stream's norm do not follow it
        assert isinstance(block.norm_stream, nn.LayerNorm) == is_dynamic_block(i, period)
        assert isinstance(block.dwc, DynamicDWConv) == is_dynamic_block(i, 3)
        if i not in linears:
            assert type(block.mlp.fc1) is nn.Linear


def test_dynamic_linear_start_is_a_zero_update_in_the_earlier_blocks():
    """The same weights with ΔW forced to 0 in blocks 0 and 1 (the gated gain's start set to 0) compute the same."""
    kwargs = dict(dynamic_period=1, dwc_dynamic_period=3, linear_predictor="double_centered_gated")
    late = small_model(**kwargs, dynamic_linear_start=2).eval()
    every = small_model(**kwargs).eval()
    every.load_state_dict(late.state_dict(), strict=False)  # every block's predictor but blocks 0-1's: late's
    for block in list(every.blocks)[:2]:
        block.mlp.fc1.predictor.start = 0.0  # g = 0·exp(κ·s): ΔW = 0
    x = torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        torch.testing.assert_close(late(x), every(x), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():  # and the in-place inference path
        torch.testing.assert_close(late(x), every(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("start", [-1, 6, True, 1.5])
def test_dynamic_linear_start_refuses_what_is_not_a_block_index(start):
    with pytest.raises(ValueError, match="dynamic_linear_start must be a block index from 0"):
        WeightFormer(embed_dim=32, depth=5, dynamic_period=1, dynamic_linear_start=start, device="meta")


def test_no_class_token_no_position_embedding_layernorm_after_patches():
    model = small_model()
    names = [n for n, _ in model.named_parameters()]
    assert not any("cls_token" in n or "pos_embed" in n for n in names)
    assert isinstance(model.norm_pre, torch.nn.LayerNorm) and model.norm_pre.eps == 1e-6


def test_dynamic_block_normalises_the_residual_stream_itself():
    """x ← LN(x) before the DWC residual: the block's output is unchanged by shifting its input."""
    model = small_model(dynamic_period=1)
    block = model.blocks[0]
    x = torch.randn(1, 3, 3, 32)
    with torch.no_grad():
        torch.testing.assert_close(block(x), block(x * 3 + 1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("size", [(16, 16), (17, 40), (100, 60), (31, 31), (224, 96)])
def test_any_input_size(size):
    model = small_model()
    with torch.no_grad():
        logits = model(torch.randn(2, 3, *size))
        features = model.forward_features(torch.randn(2, 3, *size))
    assert logits.shape == (2, 7) and torch.isfinite(logits).all()
    assert features.shape == (2, size[0] // 16, size[1] // 16, 32)


def test_pixels_past_the_last_whole_patch_are_dropped_as_in_the_release():
    model = small_model(dynamic_period=1)
    x = torch.randn(1, 3, 56, 40)  # a 3×2 grid of whole patches and 8 pixels more on each side
    with torch.no_grad():
        cropped = model(x[:, :, :48, :32])
        torch.testing.assert_close(model(x), cropped, rtol=0, atol=0)
        x[:, :, 48:] = 100.0
        x[:, :, :, 32:] = 100.0
        torch.testing.assert_close(model(x), cropped, rtol=0, atol=0)


def test_outputs_do_not_depend_on_the_rest_of_the_batch():
    model = small_model(dynamic_period=1)
    x = torch.randn(4, 3, 48, 64)
    with torch.no_grad():
        batched = model(x)
        other = model(torch.cat([x[:1], torch.randn(3, 3, 48, 64)]))
        single = torch.cat([model(x[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched[:1], other[:1], rtol=1e-5, atol=1e-5)


def test_bad_inputs_raise_value_error():
    model = small_model()
    with pytest.raises(ValueError, match="expected 3 input channels, got 1"):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match="smaller than one 16x16 patch"):
        model(torch.randn(1, 3, 15, 64))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        model(torch.randn(3, 32, 32))


def test_reference_implementation_matches_fast_path():
    model = small_model(dynamic_period=1)
    x = torch.randn(3, 3, 80, 48)
    with torch.no_grad():
        fast = model(x)
        model.set_implementation("reference")
        ref = model(x)
    assert ((fast - ref).norm() / ref.norm()).item() <= 1e-5
    with pytest.raises(ValueError):
        model.set_implementation("turbo")


def test_forward_head_and_reset_classifier():
    model = small_model()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        feats = model.forward_features(x)
        assert feats.shape == (2, 4, 4, 32)
        assert model.forward_head(feats, pre_logits=True).shape == (2, 32)
        assert model.get_classifier().out_features == 7
        model.reset_classifier(3)
        assert model(x).shape == (2, 3)
        model.reset_classifier(0, "")
        assert model(x).shape == (2, 4, 4, 32)


def test_forward_intermediates_and_pruning():
    model = small_model()
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, indices=[0, 2])
        assert final.shape == (1, 4, 3, 32) and [t.shape for t in inter] == [(1, 32, 4, 3)] * 2
        only = model.forward_intermediates(x, indices=2, output_fmt="NHWC", intermediates_only=True, norm=True)
        assert len(only) == 2 and only[0].shape == (1, 4, 3, 32)
        expected = model.forward_features(x)
        torch.testing.assert_close(model.forward_intermediates(x, indices=1, norm=True)[1][0],
                                   expected.permute(0, 3, 1, 2))
    kept = model.prune_intermediate_layers([1])
    assert kept == [1] and len(model.blocks) == 2 and model.num_classes == 0


def test_features_only():
    model = timm.create_model("weightformer_tiny", features_only=True, out_indices=(4, 10, 16))
    assert model.feature_info.channels() == [192] * 3 and model.feature_info.reduction() == [16] * 3
    with torch.no_grad():
        feats = model(torch.randn(1, 3, 96, 64))
    assert [f.shape for f in feats] == [(1, 192, 6, 4)] * 3


def test_grad_checkpointing_gives_the_same_gradients():
    model = small_model().train()
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


def test_optimizer_api():
    model = small_model()
    groups = timm.models._manipulate.group_parameters(model, model.group_matcher(), reverse=True)
    assert len(set(groups.values())) > 2
    assert model.no_weight_decay() == set()


# bf16 keeps 8 significant bits (a relative step of 2^-8 ≈ 0.4%); through 4 blocks the logits stay
# within 5% of float32's (relative L2 error; measured 0.6-1.4%).
BF16_REL_TOL = 5e-2


@pytest.mark.parametrize("dynamic_period", [1, 3])
def test_bf16_autocast_matches_float32(dynamic_period):
    model = small_model(dynamic_period=dynamic_period).train()
    x = torch.randn(2, 3, 48, 48)
    expected = model(x).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - expected).norm() / expected.norm()).item() <= BF16_REL_TOL
    out.float().logsumexp(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_model_in_bf16_weights_matches_float32():
    model = small_model()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        expected = model(x)
        out = model.to(torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert ((out.float() - expected).norm() / expected.norm()).item() <= BF16_REL_TOL


def test_torch_compile_matches_eager():
    model = small_model(dynamic_period=1)
    x = torch.randn(2, 3, 32, 48)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_torchscript_matches_eager():
    model = small_model(dynamic_period=1)
    scripted = torch.jit.script(model)
    x = torch.randn(2, 3, 48, 32)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x), rtol=1e-5, atol=1e-5)


def test_fx_feature_extraction():
    from timm.models import create_feature_extractor

    model = small_model()
    extractor = create_feature_extractor(model, {"blocks.1": "mid", "head": "out"})
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = extractor(x)
        torch.testing.assert_close(out["out"], model(x))
    assert out["mid"].shape == (1, 2, 2, 32)


def test_hooks_on_fc1_see_the_pre_activation_unchanged():
    model = small_model()
    seen = []
    model.blocks[0].mlp.fc1.register_forward_hook(lambda mod, inp, out: seen.append((out, out.clone())))
    with torch.inference_mode():
        model(torch.randn(1, 3, 32, 32))
    kept, copy = seen[0]
    torch.testing.assert_close(kept, copy)


@pytest.mark.parametrize("kwargs", [dict(depth=0), dict(embed_dim=-8), dict(patch_size=0), dict(mlp_ratio=0.0),
                                    dict(dynamic_period=-1), dict(global_pool="token"), dict(global_pool="catavgmax"),
                                    dict(dynamic_img_size=False), dict(embed_dim="abc")])
def test_bad_constructor_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        WeightFormer(**kwargs)


# ------------------------------------------------------------------------------------------------
# GELU -> fc2 runs fused only when that is exactly the modules' own computation
# ------------------------------------------------------------------------------------------------
def _with_large_mlp_weights(model: WeightFormer) -> WeightFormer:
    """MLP weights of std 0.3 (not 0.02) so that what the MLP computes shows in the logits."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for blk in model.blocks:
            for fc in (blk.mlp.fc1, blk.mlp.fc2):
                fc.weight.copy_(torch.randn(fc.weight.shape, generator=g) * 0.3)
    return model


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _count_fused_calls(monkeypatch) -> list:
    from weightformer.models import weightformer as wf_module

    calls = []
    fused = wf_module.gelu_linear

    def counting(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(wf_module, "gelu_linear", counting)
    return calls


def test_plain_mlps_run_fused_and_dropout_only_in_training_stops_it(monkeypatch):
    calls = _count_fused_calls(monkeypatch)
    model = small_model(proj_drop_rate=0.1)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(x)
        assert len(calls) == 4  # every block: eval-mode dropout drops nothing
        model.train()(x)
    assert len(calls) == 4


def test_lora_on_fc2_is_applied_and_trained():
    import peft

    model = _with_large_mlp_weights(small_model(dynamic_period=0))
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        base = model(x)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=4, target_modules=["fc2"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.3)  # peft starts B at zero, which would change nothing
    out = lora(x)
    out.square().sum().backward()
    lora_grads = [p.grad for name, p in lora.named_parameters() if "lora_" in name]
    assert lora_grads and all(g is not None and g.abs().sum() > 0 for g in lora_grads)
    with torch.no_grad():
        merged = lora.merge_and_unload()(x)  # plain nn.Linear fc2 again, with the LoRA update merged in
    assert _rel_diff(out.detach(), base) > 0.05
    torch.testing.assert_close(out.detach(), merged, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["act", "drop1", "fc2"])
@pytest.mark.parametrize("kind", ["forward", "forward_pre", "full_backward", "global_forward", "global_forward_pre"])
def test_hooks_on_the_fused_modules_fire(target, kind):
    model = small_model().train()
    module = getattr(model.blocks[0].mlp, target)
    seen = []
    registrations = {
        "forward": lambda hook: module.register_forward_hook(hook),
        "forward_pre": lambda hook: module.register_forward_pre_hook(hook),
        "full_backward": lambda hook: module.register_full_backward_hook(hook),
        "global_forward": nn.modules.module.register_module_forward_hook,
        "global_forward_pre": nn.modules.module.register_module_forward_pre_hook,
    }
    handle = registrations[kind](lambda mod, *args: seen.append(mod))
    try:
        model(torch.randn(1, 3, 32, 32)).sum().backward()
    finally:
        handle.remove()
    assert module in seen


def test_a_hook_that_changes_an_output_is_honoured():
    model = _with_large_mlp_weights(small_model())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        handle = model.blocks[2].mlp.act.register_forward_hook(lambda mod, inp, out: out * 0)
        zeroed = model(x)
        handle.remove()
        model.blocks[2].mlp.fc2.weight.zero_()  # what zeroing the activation does: fc2 gives its bias only
        torch.testing.assert_close(zeroed, model(x))
    assert _rel_diff(zeroed, before) > 0.05


@pytest.mark.parametrize("act", [nn.ReLU, partial(nn.GELU, approximate="tanh"), nn.SiLU])
def test_an_activation_swapped_after_construction_is_used(act):
    model = _with_large_mlp_weights(small_model(dynamic_period=1))
    built = small_model(dynamic_period=1, act_layer=act)
    built.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        with_gelu = model(x)
        for blk in model.blocks:
            blk.mlp.act = act()
        torch.testing.assert_close(model(x), built(x), rtol=0, atol=0)  # the same plain computation
    assert _rel_diff(built(x), with_gelu) > 1e-4  # tanh-approximated GELU: 2e-4 here
