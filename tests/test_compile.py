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


def _det_run(tmp_path):
    from weightformer.detection import DetectionTask, synthetic

    data = synthetic.write_shapes(tmp_path / "det", seed=3, split_sizes={"train": 6, "val": 1})
    kwargs = {"embed_dim": 32, "depth": 2, "conv_dim": 16, "fc_dim": 32, "rpn_pre_nms_top_n_train": 50,
              "rpn_post_nms_top_n_train": 16, "rpn_pre_nms_top_n_test": 20, "rpn_post_nms_top_n_test": 8,
              "box_batch_size_per_image": 16}
    return DetectionTask, dict(data=str(data), model="weightformer_tiny", model_kwargs=kwargs, img_size=64,
                               batch_size=2, lr=0.02)


def _seg_run(tmp_path):
    from weightformer.segmentation.synthetic import write_shapes
    from weightformer.segmentation.task import SegmentationTask

    data = write_shapes(tmp_path / "seg", train=4, val=1)
    kwargs = {"embed_dim": 32, "depth": 2, "channels": 16, "pyramid_channels": 16, "aux_channels": 8}
    return SegmentationTask, dict(data=str(data), model_kwargs=kwargs, img_size=32, num_classes=4, seg_crop=32,
                                  seg_stride=16, batch_size=2, lr=1e-3)


def _gen_run(tmp_path):
    from conftest_train import make_image_folder
    from weightformer.generation.task import GenerationTask

    data = make_image_folder(tmp_path / "gen", train_per_class=4, val_per_class=1, size=16)
    return GenerationTask, dict(data=str(data), model="wf_dit_s_4", model_kwargs={"hidden_size": 32, "depth": 2},
                                img_size=16, batch_size=4, lr=4e-3)


@pytest.mark.parametrize("run", [_det_run, _seg_run, _gen_run], ids=["detection", "segmentation", "generation"])
def test_train_compile_of_each_task_matches_eager(run, tmp_path):
    """``train --compile`` of the dense and generation tasks: two steps with ``compile_backend=aot_eager`` (Dynamo's
    graphs, their breaks and AOTAutograd's decompositions; Inductor's code generation takes minutes per task on a
    2-core CPU) give eager's weights, from the same seed and data order, within 1e-5 (decompositions reorder fp32
    sums)."""
    from conftest_train import single_thread
    from weightformer.engine import train

    task, settings = run(tmp_path)
    settings = dict(settings, epochs=1, max_steps=2, warmup_epochs=0, workers=0, device="cpu", deterministic=True,
                    ema=False, log_interval=1000)
    states = []
    with single_thread():
        for compile in (False, True):
            torch._dynamo.reset()
            try:
                result = train(dict(settings, output=str(tmp_path / f"run-{compile}"), compile=compile,
                                    compile_backend="aot_eager"), task=task)
            finally:
                torch._dynamo.reset()
            assert result.global_step == 2
            states.append(result.model.state_dict())
    eager, compiled = states
    assert eager.keys() == compiled.keys()
    for key in eager:
        torch.testing.assert_close(compiled[key], eager[key], rtol=1e-5, atol=1e-5,
                                   msg=lambda m, key=key: f"{key}: {m}")
