"""``torch.compile(dynamic=True)`` traces WeightFormer once for every image size and batch size: no
recompilation (``error_on_recompile``) at 224², 320², 448², 208×272 (an odd 13×17 token grid) and other
batch sizes, with eager's outputs.

The graph capture and its shape guards (Dynamo, then AOTAutograd's decompositions) are what decide
recompilation; they run here with the ``aot_eager`` backend. Inductor's C++ code generation adds
minutes of compiler time on a 2-core CPU, so the Inductor run of the same sizes is in
``weightformer bench export`` (benchmarks/results/cpu/export/), also with ``error_on_recompile``.
"""

import pytest
import timm
import torch

import weightformer  # noqa: F401  (registers the models)
from weightformer.layers import DynamicLinear

# Non-square first: compiling at a square size first makes Dynamo "duck size" H and W into one
# symbol, and a later non-square input then recompiles (set
# torch.fx.experimental._config.use_duck_shape = False to avoid that whatever the order).
SHAPES = [(2, 3, 320, 256), (2, 3, 224, 224), (2, 3, 320, 320), (2, 3, 448, 448), (2, 3, 208, 272), (3, 3, 224, 288)]


def test_one_compilation_serves_every_size():
    torch.manual_seed(0)
    model = timm.create_model("weightformer_tiny", embed_dim=32, depth=2, num_classes=5).eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
        for shape in SHAPES:
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)
    torch._dynamo.reset()


def test_train_compile_runs_its_first_steps(tmp_path):
    """``train --compile`` (Inductor, dynamic shapes) trains: its views saved for backward have symbolic strides
    such as 96·⌊W/4⌋ that Inductor's stride sort cannot order without ``strict_output_strides``."""
    from conftest_train import make_image_folder, tiny_config
    from weightformer.engine import train

    folder = make_image_folder(tmp_path / "data", train_per_class=4, val_per_class=2)
    torch._dynamo.reset()
    config = tiny_config(folder, tmp_path / "run", compile=True, epochs=1, max_steps=2,
                         model_kwargs={"patch_size": 4, "embed_dim": 16, "depth": 2})
    train(config, task="classification")
    torch._dynamo.reset()
    assert (tmp_path / "run" / "last.pt").is_file()


@pytest.mark.slow
def test_inductor_bilateral_core_at_a_one_token_pooled_grid():
    """Inductor (torch 2.14.1, CPU) turns a bmm with a static inner size of 1 into a broadcast product whose
    vectorised code read past the one pooled token (NaN at 3x2 and 2x3 tokens, wrong logits): the core's extra
    zero token under compile keeps it a GEMM. Compiled at 4x4 and 14x10, then called at 3x2 and 2x3."""
    torch.manual_seed(0)
    predictor = DynamicLinear(32, 128).predictor
    torch._dynamo.reset()
    compiled = torch.compile(predictor.core, fullgraph=True, dynamic=True)
    try:
        with torch.no_grad():
            for h, w in ((4, 4), (14, 10), (3, 2), (2, 3)):
                x = torch.randn(2, h, w, 32)
                torch.testing.assert_close(compiled(x), predictor.core(x), atol=1e-6, rtol=1e-5)
    finally:
        torch._dynamo.reset()


def test_an_unknown_compile_backend_is_refused_before_the_data(tmp_path):
    from conftest_train import tiny_config
    from weightformer.engine import train
    from weightformer.engine.errors import ConfigError

    config = tiny_config(tmp_path / "no-data-needed", tmp_path / "run", compile=True, compile_backend="nope")
    with pytest.raises(ConfigError, match="compile_backend 'nope' is not a torch.compile backend"):
        train(config, task="classification")
