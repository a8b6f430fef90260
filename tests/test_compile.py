"""``torch.compile(dynamic=True)`` traces WeightFormer once for every image size and batch size: no
recompilation (``error_on_recompile``) at 224², 320², 448², 208×272 (an odd 13×17 token grid) and other
batch sizes, with eager's outputs.

The graph capture and its shape guards (Dynamo, then AOTAutograd's decompositions) are what decide
recompilation; they run here with the ``aot_eager`` backend. Inductor's C++ code generation adds
minutes of compiler time on a 2-core CPU, so the Inductor run of the same sizes is in
``weightformer bench export`` (benchmarks/results/cpu/export/), also with ``error_on_recompile``.
"""

import timm
import torch

import weightformer  # noqa: F401  (registers the models)

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
