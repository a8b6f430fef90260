"""WeightFormer-DiT against an independent, functional re-statement of the authors' ``model/wfm_dit.py``.

The state dict is built here under the release's key names and shapes (random weights, adaLN not
zero so that every branch matters), loaded through the filter, and the outputs of ``forward`` and
``forward_with_cfg`` are compared in float64 with :func:`release_forward`, which shares no code with
the package.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F

from weightformer.checkpoint import CheckpointError
from weightformer.engine import load_model, load_weights
from weightformer.generation import (
    DIT_VARIANTS,
    WeightFormerDiT,
    create_dit,
    load_release_state_dict,
    variant_name,
)

HIDDEN, DEPTH, PATCH, IN_CH, SIZE, CLASSES, RATIO = 32, 5, 2, 4, 8, 7, 4.0


def release_state_dict(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random float64 weights under the release's names, for the sizes above (blocks 1 and 4 dynamic)."""
    C, O, r = HIDDEN, int(HIDDEN * RATIO), 4
    shapes = {
        "x_embedder.proj.weight": (C, IN_CH, PATCH, PATCH), "x_embedder.proj.bias": (C,),
        "t_embedder.mlp.0.weight": (C, 256), "t_embedder.mlp.0.bias": (C,),
        "t_embedder.mlp.2.weight": (C, C), "t_embedder.mlp.2.bias": (C,),
        "y_embedder.embedding_table.weight": (CLASSES + 1, C),
        "final_layer.linear.weight": (PATCH * PATCH * 2 * IN_CH, C), "final_layer.linear.bias": (PATCH * PATCH * 2 * IN_CH,),
        "final_layer.adaLN_modulation.1.weight": (2 * C, C), "final_layer.adaLN_modulation.1.bias": (2 * C,),
    }
    for i in range(DEPTH):
        p = f"blocks.{i}."
        shapes.update({p + "adaLN_modulation.1.weight": (6 * C, C), p + "adaLN_modulation.1.bias": (6 * C,),
                       p + "linear2.weight": (C, O), p + "linear2.bias": (C,)})
        if (i + 2) % 3 == 0:
            shapes.update({p + "linear1.w": (C, O), p + "linear1.b": (O,), p + "linear1.wfm.weight": (C // r + O // r, C),
                           p + "linear1.wfm.bias": (C // r + O // r,), p + "linear1.w1": (C // r, C),
                           p + "linear1.w2": (O // r, O), p + "dwc.w": (C, 1, 3, 3), p + "dwc.b": (C,),
                           p + "dwc.wfm.0.weight": (C, C, 1, 1), p + "dwc.wfm.0.bias": (C,),
                           p + "dwc.wfm.2.weight": (C, C, 1, 1)})
        else:
            shapes.update({p + "linear1.weight": (O, C), p + "linear1.bias": (O,), p + "dwc.weight": (C, 1, 3, 3),
                           p + "dwc.bias": (C,)})
    state = {k: torch.randn(s, generator=generator, dtype=torch.float64) * 0.2 for k, s in shapes.items()}
    state["pos_embed"] = sincos_2d(C, SIZE // PATCH)[None]  # a fixed buffer, saved in the release's checkpoints
    return state


def sincos_2d(dim: int, side: int) -> torch.Tensor:
    """MAE's 2-D sin-cos table: the first half encodes the column (w) index, the second the row."""
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4))
    rows, cols = np.meshgrid(np.arange(side), np.arange(side), indexing="ij")

    def encode(pos):
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return torch.from_numpy(np.concatenate([encode(cols), encode(rows)], axis=1))


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:], eps=1e-6)


def release_forward(sd: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    B = x.shape[0]
    side = SIZE // PATCH
    N = side * side
    h = F.conv2d(x, sd["x_embedder.proj.weight"], sd["x_embedder.proj.bias"], stride=PATCH).flatten(2).transpose(1, 2)
    h = h + sincos_2d(HIDDEN, side)
    half = 128
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)  # float32, as released
    args = t.float()[:, None] * freqs[None]
    temb = torch.cat([torch.cos(args), torch.sin(args)], -1).double()
    temb = F.linear(F.silu(F.linear(temb, sd["t_embedder.mlp.0.weight"], sd["t_embedder.mlp.0.bias"])),
                    sd["t_embedder.mlp.2.weight"], sd["t_embedder.mlp.2.bias"])
    c = temb + sd["y_embedder.embedding_table.weight"][y]
    for i in range(DEPTH):
        p = f"blocks.{i}."
        mod = F.linear(F.silu(c), sd[p + "adaLN_modulation.1.weight"], sd[p + "adaLN_modulation.1.bias"])
        s1, sc1, g1, s2, sc2, g2 = [m[:, None] for m in mod.chunk(6, dim=1)]
        h = layer_norm(h)
        u = (h * (1 + sc1) + s1).transpose(1, 2).reshape(B, HIDDEN, side, side)
        if (i + 2) % 3 == 0:
            pooled = F.adaptive_avg_pool2d(u, 3)
            k = F.conv2d(F.gelu(F.conv2d(pooled, sd[p + "dwc.wfm.0.weight"], sd[p + "dwc.wfm.0.bias"])),
                         sd[p + "dwc.wfm.2.weight"])
            k = k.reshape(B * HIDDEN, 1, 3, 3)
            k = k / (k.norm(dim=(-2, -1), keepdim=True) + 1) + sd[p + "dwc.w"].repeat(B, 1, 1, 1)
            u = F.conv2d(u.reshape(1, B * HIDDEN, side, side), k, sd[p + "dwc.b"].repeat(B), padding=1,
                         groups=B * HIDDEN).reshape(B, HIDDEN, side, side)
        else:
            u = F.conv2d(u, sd[p + "dwc.weight"], sd[p + "dwc.bias"], padding=1, groups=HIDDEN)
        h = h + g1 * u.flatten(2).transpose(1, 2)
        v = layer_norm(h) * (1 + sc2) + s2
        if (i + 2) % 3 == 0:
            O = sd[p + "linear1.w"].shape[1]
            vp = F.avg_pool2d(v.transpose(1, 2).reshape(B, HIDDEN, side, side), 2).flatten(2).transpose(1, 2)
            proj = F.linear(vp, sd[p + "linear1.wfm.weight"], sd[p + "linear1.wfm.bias"])
            a = F.silu(proj[..., : HIDDEN // 4]) @ sd[p + "linear1.w1"]
            b = F.silu(proj[..., HIDDEN // 4:]) @ sd[p + "linear1.w2"]
            w = a.transpose(1, 2) @ b * HIDDEN**-0.5 / N
            w = w / (w.norm(dim=1, keepdim=True) + 1) + sd[p + "linear1.w"]
            v = v @ w + sd[p + "linear1.b"]
            assert v.shape[-1] == O
        else:
            v = F.linear(v, sd[p + "linear1.weight"], sd[p + "linear1.bias"])
        v = F.linear(F.gelu(v, approximate="tanh"), sd[p + "linear2.weight"], sd[p + "linear2.bias"])
        h = h + g2 * v
    shift, scale = F.linear(F.silu(c), sd["final_layer.adaLN_modulation.1.weight"],
                            sd["final_layer.adaLN_modulation.1.bias"]).chunk(2, dim=1)
    h = layer_norm(h) * (1 + scale[:, None]) + shift[:, None]
    h = F.linear(h, sd["final_layer.linear.weight"], sd["final_layer.linear.bias"])  # (B, N, p·p·2C)
    h = h.reshape(B, side, side, PATCH, PATCH, 2 * IN_CH).permute(0, 5, 1, 3, 2, 4)
    return h.reshape(B, 2 * IN_CH, SIZE, SIZE)


def release_forward_with_cfg(sd, x, t, y, scale, guided):
    half = x[: len(x) // 2]
    out = release_forward(sd, torch.cat([half, half]), t, y)
    cond, uncond = out[:, :guided].chunk(2)
    guided_half = uncond + scale * (cond - uncond)
    return torch.cat([torch.cat([guided_half, guided_half]), out[:, guided:]], dim=1)


@pytest.fixture(scope="module")
def loaded():
    gen = torch.Generator().manual_seed(0)
    sd = release_state_dict(gen)
    model = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=CLASSES).double().eval()
    load_release_state_dict(model, {"ema": {k: v.clone() for k, v in sd.items()}, "args": None})
    x = torch.randn(4, IN_CH, SIZE, SIZE, generator=gen, dtype=torch.float64)
    t = torch.tensor([0, 17, 500, 999])
    y = torch.tensor([3, 6, CLASSES, 1])
    return model, sd, x, t, y


def test_release_state_dict_gives_the_release_forward(loaded):
    model, sd, x, t, y = loaded
    with torch.no_grad():
        ours = model(x, t, y)
    torch.testing.assert_close(ours, release_forward(sd, x, t, y), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("guidance, guided", [("release", 3), ("standard", IN_CH)])
def test_forward_with_cfg_guides_the_release_channels_or_all(loaded, guidance, guided):
    model, sd, x, t, y = loaded
    y = torch.tensor([3, 6, CLASSES, CLASSES])
    t = torch.tensor([250, 40, 250, 40])
    with torch.no_grad():
        ours = model.forward_with_cfg(x, t, y, 4.0, guidance=guidance)
    torch.testing.assert_close(ours, release_forward_with_cfg(sd, x, t, y, 4.0, guided), rtol=1e-10, atol=1e-10)


def test_the_engine_loader_translates_the_release_layout_through_the_filter(loaded):
    """``load_weights`` calls the module's ``checkpoint_filter_fn(state_dict, model)`` for keys that do not fit."""
    model, sd, x, t, y = loaded
    fresh = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=CLASSES).double().eval()
    load_weights(fresh, {"model": {k: v.clone() for k, v in sd.items()}})
    with torch.no_grad():
        torch.testing.assert_close(fresh(x, t, y), model(x, t, y), rtol=0, atol=0)


def test_a_state_dict_of_another_wf_dit_is_a_checkpoint_error_not_a_type_error(tmp_path):
    """Weights of another width (our layout) or depth (the release's) go through the filter and are refused
    as not fitting, naming the first differing keys; so are they through ``load_model`` from a checkpoint."""
    model = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=CLASSES)
    wider = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=2 * HIDDEN, depth=DEPTH,
                            num_classes=CLASSES).state_dict()
    with pytest.raises(CheckpointError, match="does not fit the model .WeightFormerDiT.*shape mismatch"):
        load_weights(model, {"model": wider})
    release = release_state_dict(torch.Generator().manual_seed(1))
    shallower = {k: v for k, v in release.items() if not k.startswith(f"blocks.{DEPTH - 1}.")}
    with pytest.raises(CheckpointError, match=r"does not fit the model \(WeightFormerDiT\).*missing from it"):
        load_weights(model, shallower)
    meta = {"task": "generation", "model": "wf_dit_s_2", "input_size": SIZE, "in_channels": IN_CH,
            "num_classes": CLASSES, "model_kwargs": {"hidden_size": HIDDEN, "depth": DEPTH}}
    torch.save({"model": wider, "meta": meta}, tmp_path / "wider.pt")
    with pytest.raises(CheckpointError, match="wider.pt does not fit"):
        load_model(tmp_path / "wider.pt", task="generation")


def test_release_and_standard_guidance_differ_on_latents(loaded):
    model, _, x, t, _ = loaded
    y = torch.tensor([3, 6, CLASSES, CLASSES])
    with torch.no_grad():
        release = model.forward_with_cfg(x, t, y, 4.0)
        standard = model.forward_with_cfg(x, t, y, 4.0, guidance="standard")
    assert torch.equal(release[:, :3], standard[:, :3]) and not torch.allclose(release[:, 3], standard[:, 3])


def test_named_variants_match_the_release_and_dit():
    assert variant_name("WF-DiT-S/2") == "wf_dit_s_2"
    for size, hidden in (("s", 384), ("b", 768)):
        for patch in (2, 4, 8):
            args = DIT_VARIANTS[f"wf_dit_{size}_{patch}"]
            assert (args["depth"], args["hidden_size"], args["patch_size"]) == (15, hidden, patch)
    assert DIT_VARIANTS["dit_xl_2"] == dict(hidden_size=1152, depth=28, patch_size=2, mixer="attention", num_heads=16)
    model = timm.create_model("wf_dit_s_8", input_size=16, in_channels=1, num_classes=3)
    assert [b.dynamic for b in model.blocks[:5]] == [False, True, False, False, True]


def test_fixed_position_embedding_is_the_2d_sincos_table():
    model = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=1)
    torch.testing.assert_close(model.pos_embed[0].double(), sincos_2d(HIDDEN, SIZE // PATCH), rtol=0, atol=1e-6)
    assert "pos_embed" not in dict(model.named_parameters())


def test_attention_baseline_runs_and_starts_at_zero_output():
    model = create_dit("dit_s_4", input_size=16, in_channels=3, num_classes=5, hidden_size=48, depth=2, num_heads=4)
    out = model(torch.randn(2, 3, 16, 16), torch.tensor([1, 2]), torch.tensor([0, 5]))
    assert out.shape == (2, 6, 16, 16) and torch.count_nonzero(out) == 0  # adaLN-Zero: the output layer starts at 0


@pytest.mark.parametrize("name", ["dit_s_4", "wf_dit_s_4"])
def test_block_init_vit_draws_the_blocks_mixer_and_mlp_from_a_normal_of_std_002(name):
    kwargs = dict(input_size=16, in_channels=1, num_classes=3, hidden_size=64, depth=3,
                  **({"num_heads": 2} if name.startswith("dit") else {}))
    torch.manual_seed(0)
    dit = create_dit(name, **kwargs)
    torch.manual_seed(0)
    vit = create_dit(name, block_init="vit", **kwargs)
    bound = math.sqrt(6 / (64 + 64 * 4))  # Xavier-uniform's bound for a 64 -> 256 MLP layer
    for (key, a), b in zip(dit.state_dict().items(), vit.state_dict().values()):
        if not key.startswith("blocks.") or "adaLN" in key or ".predictor." in key or not key.endswith("weight"):
            # the rest is drawn as DiT draws it (other values: the extra draws move the generator), zeros kept
            assert torch.equal(a == 0, b == 0), key
            assert a.numel() < 100 or abs(a.std() - b.std()) <= 0.2 * a.std(), key
        elif a.dim() == 2:  # the mixer's and the MLP's linear layers
            assert 0.018 < b.std().item() < 0.022 and b.abs().max() < 0.12, key
    fc = "mlp.fc1" if name.startswith("dit") else "linear2"
    dit_fc = dict(dit.named_parameters())[f"blocks.0.{fc}.weight"]
    assert dit_fc.abs().max() <= bound and dit_fc.std() > 0.05  # "dit" (the default) keeps Xavier
    with pytest.raises(ValueError, match="block_init must be one of"):
        create_dit(name, block_init="xavier", **kwargs)


def test_dwc_dynamic_period_makes_the_other_dynamic_blocks_convs_static():
    """As in the classifier: every block's MLP dynamic, the conv dynamic only in blocks 1 and 4; refused for a
    period that names a static block, and for the attention DiT."""
    from weightformer.layers import DynamicDWConv, DynamicLinear

    model = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=CLASSES, dynamic_period=1, dwc_dynamic_period=3)
    assert [isinstance(b.dwc, DynamicDWConv) for b in model.blocks] == [False, True, False, False, True]
    assert all(isinstance(b.linear1, DynamicLinear) for b in model.blocks)
    x, t, y = torch.randn(2, IN_CH, SIZE, SIZE), torch.tensor([10, 500]), torch.tensor([0, 3])
    assert model(x, t, y).shape == (2, 2 * IN_CH, SIZE, SIZE)
    with pytest.raises(ValueError, match="makes the conv of a static block dynamic"):
        WeightFormerDiT(input_size=SIZE, patch_size=PATCH, hidden_size=HIDDEN, depth=DEPTH, dwc_dynamic_period=2)
    with pytest.raises(ValueError, match="attention DiT has none"):
        WeightFormerDiT(input_size=SIZE, patch_size=PATCH, hidden_size=HIDDEN, depth=DEPTH, mixer="attention",
                        num_heads=4, dwc_dynamic_period=3)


def test_dynamic_linear_start_keeps_the_earlier_blocks_mlp_static():
    """As in the classifier: the MLP dynamic only from block 2 on, the convs as dwc_dynamic_period says."""
    from weightformer.layers import DynamicDWConv, DynamicLinear

    model = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=CLASSES, dynamic_period=1, dwc_dynamic_period=3, dynamic_linear_start=2)
    assert [isinstance(b.linear1, DynamicLinear) for b in model.blocks] == [False, False, True, True, True]
    assert [isinstance(b.dwc, DynamicDWConv) for b in model.blocks] == [False, True, False, False, True]
    x, t, y = torch.randn(2, IN_CH, SIZE, SIZE), torch.tensor([10, 500]), torch.tensor([0, 3])
    assert model(x, t, y).shape == (2, 2 * IN_CH, SIZE, SIZE)
    with pytest.raises(ValueError, match="dynamic_linear_start must be a block index"):
        WeightFormerDiT(input_size=SIZE, patch_size=PATCH, hidden_size=HIDDEN, depth=DEPTH, dynamic_linear_start=-1)
    with pytest.raises(ValueError, match="attention DiT has none"):
        WeightFormerDiT(input_size=SIZE, patch_size=PATCH, hidden_size=HIDDEN, depth=DEPTH, mixer="attention",
                        num_heads=4, dynamic_linear_start=2)


def test_dwc_predictor_and_static_led_reach_the_dynamic_convs():
    """As in the classifier: the dynamic convs take the predictor and start named; the static ones stay nn.Conv2d."""
    from weightformer.layers import DynamicDWConv

    model = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=CLASSES, dynamic_period=1, dwc_predictor="offset_corr", dwc_static_led=True)
    convs = [b.dwc for b in model.blocks]
    assert all(isinstance(c, DynamicDWConv) and c.static_led and c.predictor_name == "offset_corr" for c in convs)
    assert all(c.weight.flatten(1).norm(dim=-1).mean() > 0.3 for c in convs)  # nn.Conv2d's draws, not 0.02's
    x, t, y = torch.randn(2, IN_CH, SIZE, SIZE), torch.tensor([10, 500]), torch.tensor([0, 3])
    assert model(x, t, y).shape == (2, 2 * IN_CH, SIZE, SIZE)
    with pytest.raises(ValueError, match="attention DiT has none"):
        WeightFormerDiT(input_size=SIZE, patch_size=PATCH, hidden_size=HIDDEN, depth=DEPTH, mixer="attention",
                        num_heads=4, dwc_static_led=True)


def test_dwc_padding_reaches_every_conv_of_the_denoiser():
    from weightformer.layers import DynamicDWConv
    from weightformer.layers.dynamic_dwconv import BackgroundPaddedConv2d

    model = WeightFormerDiT(input_size=SIZE, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=CLASSES, dwc_padding="background")
    assert all(b.dwc.padding == "background" if isinstance(b.dwc, DynamicDWConv)
               else type(b.dwc) is BackgroundPaddedConv2d for b in model.blocks)
    x, t, y = torch.randn(2, IN_CH, SIZE, SIZE), torch.tensor([10, 500]), torch.tensor([0, 3])
    assert model(x, t, y).shape == (2, 2 * IN_CH, SIZE, SIZE)
    with pytest.raises(ValueError, match="attention DiT has none"):
        WeightFormerDiT(input_size=SIZE, patch_size=PATCH, hidden_size=HIDDEN, depth=DEPTH, mixer="attention",
                        num_heads=4, dwc_padding="background")
    with pytest.raises(ValueError, match="dwc_padding must be one of"):
        WeightFormerDiT(input_size=SIZE, patch_size=PATCH, hidden_size=HIDDEN, depth=DEPTH, dwc_padding="circular")
