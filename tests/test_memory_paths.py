"""The memory-saving inference paths (in-place residual additions, the MLP over chunks of tokens) and the
recomputed GELU of WF-DiT's training step, against independent re-statements and the plain paths.

The chunk size is shrunk (``MLP_CHUNK_BYTES``) so that small models run their MLPs over several chunks,
the last one shorter. ``classifier_forward`` re-states WeightFormer from its state dict with the formulas
of ``layer_formulas`` (no code of the package); WF-DiT is compared with ``release_forward`` of
test_generation_model. The memory tests record the size of every tensor an op returns
(a ``TorchDispatchMode``): deterministic, no timing.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import weightformer.layers.inference as inference
from layer_formulas import dwconv_layer, linear_layer
from test_generation_model import DEPTH, HIDDEN, IN_CH, PATCH, SIZE, loaded, release_forward  # noqa: F401 (fixture)
from weightformer.generation import WeightFormerDiT
from weightformer.models import WeightFormer, is_dynamic_block

EMBED, MLP_RATIO = 32, 4


def small_classifier(**kwargs) -> WeightFormer:
    torch.manual_seed(0)
    model = WeightFormer(embed_dim=EMBED, depth=4, num_classes=7, **kwargs).double().eval()
    with torch.no_grad():  # weights large enough that every branch changes the output
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def classifier_forward(sd: dict, x: torch.Tensor, depth: int, patch: int = 16) -> torch.Tensor:
    """WeightFormer's logits from its state dict: patch conv, LN, blocks (LN of the stream in dynamic
    ones, depthwise conv, LN -> fc1 -> GELU -> fc2), LN, token mean, head."""

    def ln(t, name):
        return F.layer_norm(t, t.shape[-1:], sd[name + ".weight"], sd[name + ".bias"], eps=1e-6)

    def sub(prefix):
        return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}

    h = F.conv2d(x, sd["patch_embed.proj.weight"], sd["patch_embed.proj.bias"], stride=patch).permute(0, 2, 3, 1)
    h = ln(h, "norm_pre")  # (B, H, W, C)
    for i in range(depth):
        p = f"blocks.{i}."
        if is_dynamic_block(i, 3):
            h = ln(h, p + "norm_stream")
            mixed = dwconv_layer("adaptive", sub(p + "dwc."), h.permute(0, 3, 1, 2), 3)
        else:
            mixed = F.conv2d(h.permute(0, 3, 1, 2), sd[p + "dwc.weight"], sd[p + "dwc.bias"], padding=1, groups=EMBED)
        h = h + mixed.permute(0, 2, 3, 1)
        u = ln(h, p + "norm_mlp")
        if is_dynamic_block(i, 3):
            u = linear_layer("bilateral", sub(p + "mlp.fc1."), u)
        else:
            u = F.linear(u, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])
        h = h + F.linear(F.gelu(u), sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"])
    return F.linear(ln(h, "norm").mean(dim=(1, 2)), sd["head.weight"], sd["head.bias"])


class HiddenSizes(TorchDispatchMode):
    """Records the number of elements of every tensor an op returns whose last dimension is ``width``."""

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.numels: list[int] = [0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.numels += [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.dim() > 1
                        and t.shape[-1] == self.width]
        return out


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 7 tokens of a 128-wide hidden layer in float64: a 4×4 grid (16 tokens) runs in 3 chunks."""
    monkeypatch.setattr(inference, "MLP_CHUNK_BYTES", 7 * EMBED * MLP_RATIO * 8)


@pytest.mark.parametrize("batch", [1, 3])
def test_classifier_inference_in_chunks_matches_the_formulas(small_chunks, batch):
    model = small_classifier()
    x = torch.randn(batch, 3, 64, 80, dtype=torch.float64)  # a 4×5 grid: 20 tokens, chunks of 7, 7 and 6
    with torch.inference_mode():
        ours = model(x)
    expected = classifier_forward(model.state_dict(), x, depth=4)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)


def test_classifier_inference_in_chunks_never_holds_the_whole_hidden_layer(small_chunks):
    model = small_classifier()
    x = torch.randn(1, 3, 96, 176, dtype=torch.float64)  # 6×11 = 66 tokens; a whole hidden layer is 66 × 128
    whole_hidden = 66 * EMBED * MLP_RATIO
    with torch.no_grad(), HiddenSizes(EMBED * MLP_RATIO) as sizes:
        model(x)
    assert 0 < max(sizes.numels) < whole_hidden
    with HiddenSizes(EMBED * MLP_RATIO) as sizes:  # with gradients: the plain path, which keeps the whole hidden layer
        model(x)
    assert max(sizes.numels) == whole_hidden


def test_a_block_in_place_leaves_its_input_and_returned_intermediates_alone(small_chunks):
    model = small_classifier()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        tokens = model.norm_pre(model.patch_embed(x))
        before = tokens.clone()
        for block in model.blocks:
            block(tokens)
        torch.testing.assert_close(tokens, before, rtol=0, atol=0)
        final, intermediates = model.forward_intermediates(x, output_fmt="NHWC")
    with torch.enable_grad():
        plain_final, plain_intermediates = model.forward_intermediates(x, output_fmt="NHWC")
    torch.testing.assert_close(final, plain_final.detach(), rtol=1e-12, atol=1e-12)
    for ours, plain in zip(intermediates, plain_intermediates):
        torch.testing.assert_close(ours, plain.detach(), rtol=1e-12, atol=1e-12)


def test_a_hook_on_fc1_or_norm_keeps_the_plain_path(small_chunks):
    model = small_classifier()
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    seen = []
    model.blocks[1].mlp.fc1.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    model.blocks[2].norm_mlp.register_forward_hook(lambda mod, inp, out: seen.append(out.shape))
    with torch.no_grad():
        out = model(x)
    assert seen == [(1, 4, 4, EMBED * MLP_RATIO), (1, 4, 4, EMBED)]  # whole grids, called once each
    torch.testing.assert_close(out, classifier_forward(model.state_dict(), x, depth=4), rtol=1e-10, atol=1e-10)


def test_wf_dit_inference_in_chunks_matches_the_release(loaded, monkeypatch):
    model, sd, x, t, y = loaded
    monkeypatch.setattr(inference, "MLP_CHUNK_BYTES", 5 * HIDDEN * 4 * 8)  # 16 tokens: chunks of 5, 5, 5, 1
    with torch.no_grad():
        ours = model(x, t, y)
    torch.testing.assert_close(ours, release_forward(sd, x, t, y), rtol=1e-10, atol=1e-10)


def test_wf_dit_inference_never_holds_the_whole_hidden_layer(monkeypatch):
    torch.manual_seed(0)
    model = WeightFormerDiT(input_size=SIZE * 2, patch_size=PATCH, in_channels=IN_CH, hidden_size=HIDDEN, depth=DEPTH,
                            num_classes=7).double().eval()
    monkeypatch.setattr(inference, "MLP_CHUNK_BYTES", 5 * HIDDEN * 4 * 8)
    x = torch.randn(2, IN_CH, SIZE * 2, SIZE * 2, dtype=torch.float64)  # 64 tokens a sample
    t, y = torch.tensor([3, 700]), torch.tensor([1, 7])
    whole_hidden = 2 * 64 * HIDDEN * 4
    with torch.no_grad(), HiddenSizes(HIDDEN * 4) as sizes:
        model(x, t, y)
    assert 0 < max(sizes.numels) < whole_hidden
    with HiddenSizes(HIDDEN * 4) as sizes:
        model(x, t, y)
    assert max(sizes.numels) == whole_hidden


def test_wf_dit_training_gradients_match_the_release(loaded):
    """The training step recomputes the tanh-GELU in backward (gelu_linear): gradients are autograd's
    of the release's formulas."""
    model, sd, x, t, y = loaded
    model = model.train()
    try:
        out = model(x, t, y, force_drop=torch.zeros(len(y)))  # no random label dropout
        weights = dict(model.named_parameters())
        released = {k: v.clone().requires_grad_(True) for k, v in sd.items()}
        expected = release_forward(released, x, t, y)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
        grad_out = torch.randn_like(out)
        ours = torch.autograd.grad(out, [weights["blocks.0.linear2.weight"], weights["blocks.1.linear1.weight"],
                                         weights["blocks.3.linear1.bias"], weights["x_embedder.proj.weight"]], grad_out)
        theirs = torch.autograd.grad(expected, [released["blocks.0.linear2.weight"], released["blocks.1.linear1.w"],
                                                released["blocks.3.linear1.bias"], released["x_embedder.proj.weight"]],
                                     grad_out)
    finally:
        model.eval()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b.T if a.shape != b.shape else b, rtol=1e-9, atol=1e-10)
