"""The long-range design as every task's backbone: ``--long-range``, weightformer_long_range_small and the
WF-DiT long-range variants."""

import importlib.util
import shlex
from pathlib import Path

import pytest
import timm
import torch

import weightformer  # noqa: F401  (registers the models)
from weightformer.engine.errors import ConfigError
from weightformer.engine.loop import prepare_config
from weightformer.models.dit import WeightFormerDiT
from weightformer.models.dit_variants import DIT_VARIANTS, LONG_RANGE_VARIANTS, create_dit
from weightformer.layers import DynamicLinear
from weightformer.layers.inference import eager_inference
from weightformer.models import weightformer_long_range_small
from weightformer.long_range import LONG_RANGE_DESIGNS
from weightformer.models.weightformer_long_range import LONG_RANGE_ARGS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("task", "released", "kept"), [
    ("classification", "weightformer_tiny", None),
    ("detection", "weightformer_tiny", {"embed_dim": 64, "depth": 4}),
    ("segmentation", "weightformer_tiny", {"embed_dim": 96, "depth": 4, "pyramid_channels": 64}),
    ("generation", "wf_dit_s_4", {"hidden_size": 64, "depth": 6, "learn_sigma": False}),
])
def test_long_range_flag_takes_the_long_range_design_and_keeps_the_recipe(task, released, kept, tmp_path):
    plain = prepare_config({"output": str(tmp_path / "a")}, task=task).cfg
    long = prepare_config({"long_range": True, "output": str(tmp_path / "b")}, task=task).cfg
    assert plain.model == released and not plain.long_range
    expected = LONG_RANGE_VARIANTS.get(released) or LONG_RANGE_DESIGNS[released]
    assert long.model == expected and long.long_range
    # The recipe's model settings, unchanged, and the design's predictor written down (so the run rebuilds
    # as it trained if the design's default changes).
    assert long.model_kwargs == {**plain.model_kwargs, "linear_predictor": LONG_RANGE_ARGS["linear_predictor"]}
    if kept:
        assert kept.items() <= long.model_kwargs.items()
    # Naming the long-range model itself is the same choice: the recipe's settings are kept too.
    named = prepare_config({"model": expected, "output": str(tmp_path / "c")}, task=task).cfg
    assert named.model_kwargs == long.model_kwargs
    # A predictor the user names wins.
    own = prepare_config({"long_range": True, "model_kwargs": {"linear_predictor": "centered"},
                          "output": str(tmp_path / "d")}, task=task).cfg
    assert own.model_kwargs["linear_predictor"] == "centered"


def test_long_range_flag_refuses_a_model_without_one(tmp_path):
    with pytest.raises(ConfigError, match="deit_tiny_patch16_224' has no long-range design.*weightformer_tiny"):
        prepare_config({"long_range": True, "model": "deit_tiny_patch16_224", "output": str(tmp_path)},
                       task="segmentation")
    with pytest.raises(ConfigError, match="dit_s_4' has no long-range design.*wf_dit"):
        prepare_config({"long_range": True, "model": "dit_s_4", "output": str(tmp_path)}, task="generation")
    # Another architecture still drops the recipe's model settings (they were chosen for its model).
    other = prepare_config({"model": "deit_tiny_patch16_224", "output": str(tmp_path)}, task="segmentation").cfg
    assert "embed_dim" not in other.model_kwargs


def test_every_long_range_name_is_a_model():
    for released, long in LONG_RANGE_DESIGNS.items():
        assert timm.is_model(released) and timm.is_model(long)
    for released, long in LONG_RANGE_VARIANTS.items():
        assert released in DIT_VARIANTS and long in DIT_VARIANTS


def test_long_range_small_is_small_with_the_long_range_predictor_everywhere():
    with torch.device("meta"):
        small = timm.create_model("weightformer_long_range_small")
        released = timm.create_model("weightformer_small")
    assert small.embed_dim == released.embed_dim == 384 and len(small.blocks) == len(released.blocks) == 17
    predictor = LONG_RANGE_ARGS["linear_predictor"]
    assert all(isinstance(b.mlp.fc1, DynamicLinear) and b.mlp.fc1.predictor_name == predictor for b in small.blocks)
    assert sum(isinstance(b.mlp.fc1, DynamicLinear) for b in released.blocks) == 6
    params = sum(p.numel() for p in small.parameters()) / 1e6
    assert f"{params:.2f}M parameters" in weightformer_long_range_small.__doc__  # the docstring's cost is current
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("weightformer_long_range_small", pretrained=True)


def _randomised(model: torch.nn.Module) -> torch.nn.Module:
    """adaLN-Zero starts with zero gates and output: give every parameter a value so the blocks matter."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model.eval()


def test_wf_dit_long_range_has_long_range_dynamic_blocks_and_its_fast_path_is_exact():
    model = create_dit("wf_dit_long_range_s_4", input_size=16, in_channels=1, hidden_size=32, depth=3,
                       num_classes=4, learn_sigma=False)
    assert all(b.dynamic and b.linear1.predictor_name == LONG_RANGE_ARGS["linear_predictor"] for b in model.blocks)
    released = create_dit("wf_dit_s_4", input_size=16, in_channels=1, hidden_size=32, depth=3, num_classes=4)
    assert [b.dynamic for b in released.blocks] == [False, True, False]
    assert all(b.linear1.predictor_name == "bilateral" for b in released.blocks if b.dynamic)
    _assert_fast_path_exact(model)


def test_wf_dit_long_range_late_form_keeps_the_first_blocks_mlp_static_and_its_fast_path_is_exact():
    model = create_dit("wf_dit_long_range_s_4", input_size=16, in_channels=1, hidden_size=32, depth=4,
                       num_classes=4, learn_sigma=False, linear_predictor="double_centered_gated",
                       dwc_dynamic_period=3, dynamic_linear_start=2)
    assert [b.dynamic for b in model.blocks] == [False, False, True, True]
    assert [type(b.dwc).__name__ for b in model.blocks] == ["Conv2d", "DynamicDWConv", "Conv2d", "Conv2d"]
    _assert_fast_path_exact(model)


def _assert_fast_path_exact(model) -> None:
    """The in-place inference path of every block gives the plain block forward's output."""
    _randomised(model)
    x, t, y = torch.randn(2, 1, 16, 16), torch.tensor([3, 700]), torch.tensor([0, 2])
    with torch.no_grad():
        assert eager_inference() and all(b.can_run_in_place() for b in model.blocks)
        fast = model(x, t, y)
        # The plain block forward, one by one (what training runs), as the reference.
        tokens = model.x_embedder(x) + model.pos_embed
        c = model.t_embedder(t) + model.y_embedder(y, False)
        for block in model.blocks:
            tokens = block(tokens, c)
        plain = model.unpatchify(model.final_layer(tokens, c))
    assert fast.abs().mean() > 0.01
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)


def test_attention_dit_refuses_weightformer_block_settings():
    with pytest.raises(ValueError, match="attention DiT has none"):
        WeightFormerDiT(input_size=8, hidden_size=32, depth=1, num_heads=2, mixer="attention",
                        linear_predictor="centered")


def _benchmark_module():
    spec = importlib.util.spec_from_file_location("long_range_tasks", ROOT / "benchmarks" / "examples" / "long_range_tasks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("task", ["det", "seg", "gen"])
def test_the_benchmarks_command_lines_resolve_to_the_variants_they_name(task, tmp_path):
    """Each variant's command line, parsed by the CLI's own parser, gives the model the table names."""
    from weightformer.engine.cli import build_parser, train_overrides
    from weightformer.engine.registry import get_task

    bench = _benchmark_module()
    names = {"det": "detection", "seg": "segmentation", "gen": "generation"}
    models = {}
    for variant in bench.VARIANTS:
        argv = bench.train_command(task, variant, 1, tmp_path / variant)
        assert argv[:3] == ["weightformer", task, "train"]
        owner = get_task(names[task])
        args = build_parser(owner).parse_args(argv[2:])
        cfg = prepare_config(train_overrides(args, owner), task=owner).cfg
        assert cfg.seed == 1 and cfg.epochs == bench.EPOCHS[task], shlex.join(argv)
        models[variant] = (cfg.model, cfg.model_kwargs)
    width = "hidden_size" if task == "gen" else "embed_dim"
    assert len({m[1][width] for m in models.values()}) == 1  # one width and depth for every variant
    assert len({m[1]["depth"] for m in models.values()}) == 1
    assert models["released_placement"][1]["linear_predictor"] == LONG_RANGE_ARGS["linear_predictor"]
    assert "long_range" in models["long_range"][0]
    late = models["long_range_late"][1]  # ΔW in the later half of the blocks
    assert late["dynamic_linear_start"] == late["depth"] // 2 and late["dwc_dynamic_period"] == 3
    led = models["long_range_static_led"][1]  # every conv dynamic, led by its static kernel
    assert led["dwc_static_led"] is True and led["dwc_predictor"] == "offset_corr" and "dwc_dynamic_period" not in led
    both_led = models["long_range_led"][1]  # and ΔW's gain started at a tenth
    assert both_led == {**led, "linear_predictor": "double_centered_gated_led"}
    assert models["long_range_led_background"][1] == {**both_led, "dwc_padding": "background"}
    assert models["attention"][0] in ("deit_tiny_patch16_224", "dit_s_4")
    if task == "gen":  # the DiT baseline is drawn as timm draws a ViT, as the DeiT baselines are
        assert models["attention"][1]["block_init"] == "vit"


@pytest.mark.parametrize("protocol", ["vitdet", "torchvision"])
def test_long_range_backbone_in_each_detection_protocol(protocol):
    from weightformer.detection.model import build_maskrcnn

    torch.manual_seed(0)
    model = build_maskrcnn("weightformer_long_range_tiny", num_classes=3, min_size=64, max_size=64, protocol=protocol,
                           conv_dim=16, fc_dim=32, embed_dim=32, depth=2).eval()
    trunk = model.backbone.backbone
    assert all(b.mlp.fc1.predictor_name == LONG_RANGE_ARGS["linear_predictor"] for b in trunk.blocks)
    with torch.no_grad():
        (out,) = model([torch.rand(3, 64, 64)])
    assert set(out) >= {"boxes", "labels", "scores", "masks"}


@pytest.mark.parametrize("protocol", ["vim", "simple-pyramid"])
def test_long_range_backbone_in_each_segmentation_protocol(protocol):
    from weightformer.segmentation.model import build_upernet

    torch.manual_seed(0)
    width = {"pyramid_channels": 16} if protocol == "simple-pyramid" else {}
    model = build_upernet("weightformer_long_range_tiny", num_classes=4, protocol=protocol, channels=16,
                          aux_channels=8, embed_dim=32, depth=4, **width).eval()
    with torch.no_grad():
        logits = model(torch.rand(1, 3, 64, 64))
    logits = logits["out"] if isinstance(logits, dict) else logits
    assert logits.shape == (1, 4, 64, 64) and torch.isfinite(logits).all()


def test_a_long_range_checkpoint_that_names_no_predictor_loads_with_the_registered_one(tmp_path):
    """A current-format meta without ``linear_predictor`` rebuilds with the design's registered predictor; one
    passed wins. (A format-0 checkpoint is upgraded to ``centered``: tests/test_legacy_checkpoints.py.)"""
    from weightformer.checkpoint import save_atomic
    from weightformer.engine import CHECKPOINT_FORMAT
    from weightformer.engine.weights import load_model

    kwargs = {"patch_size": 4, "embed_dim": 16, "depth": 1}
    model = timm.create_model("weightformer_long_range_tiny", linear_predictor="centered", num_classes=3, in_chans=1,
                              **kwargs)
    meta = {"task": "classification", "model": "weightformer_long_range_tiny", "model_kwargs": kwargs,
            "num_classes": 3, "in_chans": 1, "img_size": 28}
    old = tmp_path / "old.pt"
    save_atomic({"model": model.state_dict(), "meta": meta, "format": CHECKPOINT_FORMAT}, old)
    loaded = load_model(old, task="classification")
    assert loaded.model.blocks[0].mlp.fc1.predictor_name == LONG_RANGE_ARGS["linear_predictor"]
    pinned = load_model(old, task="classification", model_kwargs={"linear_predictor": "centered"})
    assert pinned.model.blocks[0].mlp.fc1.predictor_name == "centered"
