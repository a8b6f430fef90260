"""``torch.compile`` (Inductor) against eager: WeightFormer-T, the long-range model and WF-DiT-S, each small enough
to compile on a CPU (32-d, depth 2: a static and a dynamic block), in every mode (``fullgraph`` False / True,
``dynamic`` False / True), at the sizes users feed, batch 1 and 16: the eval forward's output, and one training
step's loss and gradients. With ``dynamic=True`` Inductor gets ``strict_output_strides``, as ``train --compile``
does: without it the training graph fails to compile (docs/deploy.md, "torch.compile").

Sizes: 64², 48×32, 32×48, 16×64 and 208×272 images, i.e. 4×4, 3×2, 2×3, 1×4 and 13×17 tokens (patch 16): the
one-token-pooled grids (3×2, 2×3), a one-token side (1×4) and an odd grid. WF-DiT has a fixed square token grid
(its position embedding), so it is built at each of the square latent sides 8, 6, 2 and 26 (patch 2: 4×4, 3×3,
1×1 and 13×13 tokens), the nearest to those grids.

Tolerance: ``rtol=1e-4``, ``atol=1e-5`` on outputs and the loss; gradients are compared with the same rtol and an
atol of 1e-5 times the largest eager gradient of the model (its scale differs by model and batch). Inductor
fuses and reorders fp32 reductions (LayerNorm, pooling, the GEMMs' K loops), so compiled and eager sums differ
by reassociation only: a relative error of order √K·2⁻²⁴ ≈ 1e-6 per reduction, compounded over the blocks and
through backward, stays below 1e-4; a real fault (a NaN, the pooled-token read past the end that
layers/dynamic_linear.py's ``plain_core`` avoids, a wrong broadcast) is off by O(1).

By default one combination runs (WeightFormer-T, ``fullgraph=True, dynamic=True``, 48×32 at batch 1). The whole matrix is opt-in: ``WF_COMPILE_MATRIX=1 python -m pytest
tests/test_compile_matrix.py -m compile_matrix -s`` (docs/deploy.md has its cost and result).
"""

import os

import pytest
import timm
import torch
import torch.nn.functional as F

import weightformer  # noqa: F401  (registers the models)
from weightformer.models.dit_variants import create_dit

RTOL, ATOL = 1e-4, 1e-5
IMAGE_SIZES = [(48, 32), (32, 48), (16, 64), (64, 64), (208, 272)]  # non-square first (see test_compile.py)
DIT_SIDES = [6, 2, 8, 26]  # latent sides, patch 2: 3×3, 1×1, 4×4, 13×13 tokens
BATCHES = [1, 16]
MODES = [pytest.param(dict(fullgraph=fullgraph, dynamic=dynamic), id=f"fullgraph={fullgraph}-dynamic={dynamic}")
         for fullgraph in (False, True) for dynamic in (False, True)]
NUM_CLASSES = 10

OPT_IN = pytest.mark.skipif(os.environ.get("WF_COMPILE_MATRIX") != "1",
                            reason="the full compile matrix is opt-in: WF_COMPILE_MATRIX=1")


def _classifier(name):
    torch.manual_seed(0)
    # depth 2: block 0 static and 1 dynamic in WeightFormer-T (every third block from 1), both dynamic in the
    # long-range model; Inductor's compile time grows with the blocks, not with what they repeat
    return timm.create_model(name, embed_dim=32, depth=2, num_classes=NUM_CLASSES)


def _dit(side):
    torch.manual_seed(0)
    model = create_dit("wf_dit_s_2", input_size=side, hidden_size=32, depth=2, num_classes=NUM_CLASSES,
                       class_dropout_prob=0.0)  # no label dropout: eager and compiled draw no random labels
    with torch.no_grad():  # adaLN-Zero starts every block as the identity and the output at 0: give them weights
        for p in model.parameters():
            if not p.any():
                p.normal_(0.0, 0.05)
    return model


def _image_batch(batch, size):
    torch.manual_seed(1)
    return (torch.randn(batch, 3, *size),), torch.randint(0, NUM_CLASSES, (batch,))


def _latent_batch(batch, side):
    torch.manual_seed(1)
    inputs = (torch.randn(batch, 4, side, side), torch.randint(0, 1000, (batch,)).float(),
              torch.randint(0, NUM_CLASSES, (batch,)))
    return inputs, torch.randn(batch, 8, side, side)


def _loss(output, target):
    return F.cross_entropy(output, target) if target.dtype == torch.long else F.mse_loss(output, target)


def _compare(model, compiled, inputs, target, where):
    """The eval forward, then one training step (loss and every gradient), compiled against eager; returns the
    largest absolute differences (output, loss, gradient)."""
    model.eval()
    with torch.no_grad():
        expected, got = model(*inputs), compiled(*inputs)
    assert torch.isfinite(got).all(), f"{where}: non-finite compiled output"
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL, msg=lambda m: f"{where}, forward: {m}")
    model.train()
    results = []
    for run in (model, compiled):
        model.zero_grad(set_to_none=True)
        loss = _loss(run(*inputs), target)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (loss_e, grads_e), (loss_c, grads_c) = results
    torch.testing.assert_close(loss_c, loss_e, rtol=RTOL, atol=ATOL, msg=lambda m: f"{where}, loss: {m}")
    assert grads_c.keys() == grads_e.keys(), f"{where}: compiled and eager give gradients to different parameters"
    scale = max(g.abs().max().item() for g in grads_e.values())
    grad_diff = 0.0
    for name, g in grads_e.items():
        assert torch.isfinite(grads_c[name]).all(), f"{where}: non-finite compiled gradient of {name}"
        torch.testing.assert_close(grads_c[name], g, rtol=RTOL, atol=ATOL * scale,
                                   msg=lambda m, name=name: f"{where}, gradient of {name}: {m}")
        grad_diff = max(grad_diff, (grads_c[name] - g).abs().max().item())
    return (got - expected).abs().max().item(), (loss_c - loss_e).abs().item(), grad_diff


def _compiled(model, mode):
    # As engine/loop.py's compiled(): with dynamic shapes Inductor's training graph otherwise fails to sort the
    # symbolic strides of the tensors it saves for backward ("cannot determine truth value of Relational").
    options = {"strict_output_strides": True} if mode["dynamic"] else None
    return torch.compile(model, backend="inductor", options=options, **mode)


def _run(model, mode, cases):
    """``model`` compiled in ``mode`` against eager over ``cases``, (where, make inputs and target) each; returns
    the largest differences (output, loss, gradient)."""
    torch._dynamo.reset()
    compiled = _compiled(model, mode)
    worst = [0.0, 0.0, 0.0]
    try:  # static mode compiles once per case: 2 graphs (eval, train) for each
        with torch._dynamo.config.patch(recompile_limit=4 * len(cases)):
            for where, make in cases:
                diffs = _compare(model, compiled, *make(), where)
                print(where, "max |compiled - eager|: output %.1e, loss %.1e, gradient %.1e" % diffs)
                worst = [max(w, d) for w, d in zip(worst, diffs)]
    finally:
        torch._dynamo.reset()
    return worst


def _run_classifier(name, mode, sizes, batches):
    cases = [(f"{name} {mode} batch {batch} at {size[0]}x{size[1]}",
              lambda batch=batch, size=size: _image_batch(batch, size)) for batch in batches for size in sizes]
    return _run(_classifier(name), mode, cases)


def test_weightformer_compiles_to_eager_at_odd_grids():
    """The default subset: ``fullgraph=True, dynamic=True`` at the one-token-pooled grid 3×2, batch 1. The other
    sizes mostly compile anew (the first, small grid leaves guards on its sizes), a minute each on this CPU: the
    matrix has them, and test_compile.py the predictor alone at 3×2 and 2×3."""
    _run_classifier("weightformer_tiny", dict(fullgraph=True, dynamic=True), [(48, 32)], [1])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["weightformer_tiny", "weightformer_long_range_tiny"])
@pytest.mark.compile_matrix
@OPT_IN
def test_classifier_compiles_to_eager(name, mode):
    worst = _run_classifier(name, mode, IMAGE_SIZES, BATCHES)
    print(f"{name} {mode} worst: output %.1e, loss %.1e, gradient %.1e" % tuple(worst))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.compile_matrix
@OPT_IN
def test_wf_dit_compiles_to_eager(mode):
    worst = [0.0, 0.0, 0.0]
    for side in DIT_SIDES:  # one model per side (the grid is fixed), so one compiled object per side
        cases = [(f"wf_dit_s_2 {mode} batch {batch} at latent {side}x{side}",
                  lambda batch=batch, side=side: _latent_batch(batch, side)) for batch in BATCHES]
        worst = [max(w, d) for w, d in zip(worst, _run(_dit(side), mode, cases))]
    print(f"wf_dit_s_2 {mode} worst: output %.1e, loss %.1e, gradient %.1e" % tuple(worst))
