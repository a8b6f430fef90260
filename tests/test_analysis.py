"""The analysis tools: ERF numbers on models whose receptive field is known exactly, the ERF CLI, and the
ablation runner (a real tiny grid, skip-finished and resume)."""

import json
import math

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from weightformer.analysis import ablate
from weightformer.analysis.erf import erf_map, erf_stats
from weightformer.cli import main
from weightformer.engine.config import load_yaml


def _conv_model(kernel: int, stride: int) -> nn.Module:
    conv = nn.Conv2d(1, 1, kernel, stride=stride, padding=kernel // 2 if stride == 1 else 0, bias=False)
    nn.init.ones_(conv.weight)
    return conv


def _features(model, x):
    return model(x)


def test_a_3x3_conv_has_no_mass_outside_its_kernel():
    erf, center = erf_map(_conv_model(3, 1), torch.randn(3, 1, 32, 32), features=_features)
    assert center == (16.0, 16.0)
    support = np.zeros((32, 32), bool)
    support[15:18, 15:18] = True
    assert erf[~support].sum() == 0
    np.testing.assert_allclose(erf[support], 1 / 9, rtol=1e-6)  # all-ones kernel: uniform over the 9 taps
    stats = erf_stats(erf, center)
    assert stats.outside_center == pytest.approx(0.0, abs=1e-12)
    # 1/9 at distance 0, 4/9 at 1, 4/9 at √2: 50% needs radius 1, 90% needs √2
    assert stats.radius_50 == pytest.approx(1.0)
    assert stats.radius_90 == pytest.approx(math.sqrt(2))
    assert stats.radius_90_rel == pytest.approx(math.sqrt(2) / (math.hypot(32, 32) / 2))


def test_a_patchify_layer_sees_exactly_its_patch():
    erf, center = erf_map(_conv_model(4, 4), torch.randn(2, 1, 32, 32), features=_features)
    assert center == (17.5, 17.5)  # centre token (4, 4) covers pixels 16..19
    assert erf[16:20, 16:20].sum() == pytest.approx(1.0) and erf[16:20, 16:20].min() > 0
    stats = erf_stats(erf, center)
    # 4 pixels at √0.5, 8 at √2.5, 4 at √4.5 from the patch centre: 50% needs the 8, 90% all 16
    assert stats.radius_50 == pytest.approx(math.sqrt(2.5))
    assert stats.radius_90 == pytest.approx(math.sqrt(4.5))


def test_mass_outside_the_centre_counts_what_lies_beyond_the_middle_half():
    erf = np.zeros((8, 8))
    erf[0, 0] = erf[4, 4] = erf[2, 5] = erf[7, 3] = 0.25  # (0,0) and (7,3) lie outside rows/cols 2..5
    assert erf_stats(erf).outside_center == pytest.approx(0.5)


def test_erf_cli_writes_png_and_json_and_refuses_to_overwrite(tmp_path, capsys):
    png = tmp_path / "erf.png"
    args = ["analyze", "erf", "--model", "weightformer_tiny:embed_dim=32,depth=2,patch_size=4",
            "--model", "weightformer_tiny:embed_dim=32,depth=2,patch_size=4,dynamic_period=0",
            "--img-size", "32", "--num-images", "2", "--output", str(png)]
    assert main(args) == 0
    report = json.loads(png.with_suffix(".json").read_text())
    assert [m["spec"].split(":")[1] for m in report["models"]][1].endswith("dynamic_period=0")
    for row in report["models"]:
        assert 0 <= row["outside_center"] <= 1 and 0 < row["radius_50"] <= row["radius_90"]
    assert png.stat().st_size > 1000
    capsys.readouterr()
    assert main(args) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["analyze", "erf", "--model", "no_such_model", "--output", str(tmp_path / "x.png")]) == 2
    assert capsys.readouterr().err.strip().startswith("error: --model 'no_such_model'")


def _grid(tmp_path, variants=None) -> str:
    config = {
        "name": "tiny", "output": str(tmp_path / "runs"), "seeds": [0], "throughput_batch": 2,
        "recipe": {"data": "glyph_match:size=32,train=16,val=8", "epochs": 1, "batch_size": 8,
                   "model_kwargs": {"embed_dim": 32, "depth": 2}},
        "variants": variants or {"released": {}, "static": {"model_kwargs": {"dynamic_period": 0}}},
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_ablation_trains_tabulates_then_skips_finished_runs_and_resumes_unfinished(tmp_path, monkeypatch, capsys):
    path = _grid(tmp_path)
    assert main(["ablate", path]) == 0
    out = capsys.readouterr().out
    assert "| released |" in out and "| static |" in out
    table = json.loads((tmp_path / "runs" / "table.json").read_text())
    rows = {r["variant"]: r for r in table["rows"]}
    assert rows["static"]["params"] < rows["released"]["params"] and rows["released"]["flops"] > 0
    assert (tmp_path / "runs" / "table.png").is_file() and (tmp_path / "runs" / "table.md").is_file()
    first = json.loads((tmp_path / "runs" / "static" / "seed0" / "result.json").read_text())
    assert first["settings"]["model_kwargs"] == {"embed_dim": 32, "depth": 2, "dynamic_period": 0}

    # An interrupted run (no result.json) is resumed from its last.pt; finished runs are not trained again.
    (tmp_path / "runs" / "static" / "seed0" / "result.json").unlink()
    calls = []
    real_train = ablate.train_one
    monkeypatch.setattr(ablate, "train_one", lambda c, v, s, **kw: calls.append(v) or real_train(c, v, s, **kw))
    assert main(["ablate", path]) == 0
    assert calls == ["static"]
    log = capsys.readouterr().out
    assert "skip released seed 0: finished" in log and "resumed from" in log
    again = json.loads((tmp_path / "runs" / "static" / "seed0" / "result.json").read_text())
    assert again["top1_last"] == first["top1_last"]  # nothing retrained: the same evaluated epoch


def test_a_table_of_other_rows_moves_the_earlier_table_aside_and_the_same_table_is_rewritten(tmp_path, capsys):
    path = _grid(tmp_path)
    runs = tmp_path / "runs"
    assert main(["ablate", path]) == 0
    both = (runs / "table.json").read_text()
    assert main(["ablate", path, "--only", "released"]) == 0  # finished runs: nothing trained, a smaller table
    assert "moved to table.json.previous-" in capsys.readouterr().out
    (aside,) = runs.glob("table.json.previous-*")
    assert aside.read_text() == both and len(list(runs.glob("table.md.previous-*"))) == 1
    assert [r["variant"] for r in json.loads((runs / "table.json").read_text())["rows"]] == ["released"]
    assert main(["ablate", path, "--only", "released"]) == 0  # the same table again: nothing moved
    assert "moved to" not in capsys.readouterr().out and len(list(runs.glob("table.json.previous-*"))) == 1


def test_ablation_config_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("variants: {a: {output: x}}\n")
    assert main(["ablate", str(bad)]) == 2
    assert "not a setting a variant may set" in capsys.readouterr().err
    assert main(["ablate", _grid(tmp_path, {"a": {"model": "no_such_model"}})]) == 2
    assert "no_such_model" in capsys.readouterr().err
    assert main(["ablate", str(tmp_path / "missing.yaml")]) == 2


def test_update_stats_see_the_released_predictor_start_near_zero_and_the_unit_one_not():
    import timm

    from weightformer.analysis.dynamics import dynamic_update_stats

    images = torch.randn(4, 3, 16, 16)
    rows = {}
    for predictor in ("bilateral", "bilateral_unit"):
        torch.manual_seed(0)
        model = timm.create_model("weightformer_tiny", patch_size=4, embed_dim=32, depth=2, img_size=16,
                                  linear_predictor=predictor)
        rows[predictor] = {r["kind"]: r for r in dynamic_update_stats(model, images)}
    for r in rows["bilateral_unit"].values():  # mean of n/(n+1) over columns, near mean(n)/(mean(n)+1)
        assert r["capped_norm"] == pytest.approx(r["delta_norm"] / (r["delta_norm"] + 1), rel=0.2)
    assert rows["bilateral"]["linear"]["delta_norm"] < 1e-3
    assert rows["bilateral_unit"]["linear"]["delta_norm"] > 0.1
    static = timm.create_model("weightformer_tiny", patch_size=4, embed_dim=32, depth=2, img_size=16, dynamic_period=0)
    assert dynamic_update_stats(static, images) == []


def test_update_stats_read_the_conv_update_the_layer_applies():
    """For a static-led conv, ΔK̂'s norm as the layer adds it to the kernel (its predicted_delta), not the
    predictor's raw output's."""
    import timm

    from weightformer.analysis.dynamics import dynamic_update_stats
    from weightformer.layers import DynamicDWConv

    torch.manual_seed(0)
    model = timm.create_model("weightformer_long_range_tiny", patch_size=4, embed_dim=32, depth=2, img_size=16,
                              dwc_static_led=True).eval()
    images = torch.randn(4, 3, 16, 16)
    inputs = {}
    convs = {n: m for n, m in model.named_modules() if isinstance(m, DynamicDWConv)}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: inputs.__setitem__(n, args[0])) for n, m in convs.items()]
    rows = {r["layer"]: r for r in dynamic_update_stats(model, images)}
    for hook in hooks:
        hook.remove()
    for name, conv in convs.items():
        with torch.no_grad():
            applied = conv.predicted_delta(inputs[name]).flatten(2).norm(dim=-1).mean().item()
        assert rows[name]["capped_norm"] == pytest.approx(applied, rel=1e-5)
        assert rows[name]["capped_norm"] < 0.2 < rows[name]["static_norm"]


def test_edge_interaction_is_zero_for_local_models_and_not_for_global_mixing(capsys):
    import timm

    from weightformer.analysis.interaction import edge_interaction, four_images

    images = four_images(32, 0, 1, np.random.default_rng(0))
    assert (images[0] != images[1]).any() and (images[0][:, :16] == images[1][:, :16]).all()  # AB: right changed
    kwargs = {"patch_size": 4, "embed_dim": 32, "depth": 2, "img_size": 32, "in_chans": 1, "num_classes": 2}
    torch.manual_seed(0)
    # 2 static blocks of 3x3 convs on an 8x8 grid: a 5-token receptive field, glyphs 6-7 tokens apart
    local = edge_interaction(timm.create_model("weightformer_tiny", dynamic_period=0, **kwargs), 32, placements=3)
    mixing = edge_interaction(timm.create_model("weightformer_tiny", dynamic_period=1, linear_predictor="centered",
                                                **kwargs), 32, placements=3)
    assert local["interaction"] < 1e-4
    assert mixing["interaction"] > 1e-2
    assert main(["analyze", "interaction", "--model", "weightformer_tiny:embed_dim=32,depth=2,patch_size=4",
                 "--img-size", "32", "--placements", "1"]) == 0
    assert '"interaction"' in capsys.readouterr().out


# --- one line for a user's mistake, before any work -------------------------------------------------
SMALL = "weightformer_tiny:embed_dim=32,depth=2,patch_size=4"


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("tool", ["erf", "updates"])
def test_an_image_smaller_than_one_patch_is_one_line_before_any_model_runs(tool, tmp_path, monkeypatch, capsys):
    """--img-size 7 under a 16 px patch is one line, not a ValueError traceback; a bad last model is found
    before the first one is analysed."""
    from weightformer.analysis import cli as analysis_cli, dynamics

    ran = []

    def analysed(*args, **kwargs):
        ran.append(args)
        raise AssertionError("a model was analysed before every model was checked")

    monkeypatch.setattr(analysis_cli, "erf_map", analysed)
    monkeypatch.setattr(dynamics, "dynamic_update_stats", analysed)
    out = ["--output", str(tmp_path / "erf.png")] if tool == "erf" else []
    assert main(["analyze", tool, "--model", "weightformer_tiny", "--img-size", "7", *out]) == 2
    assert "weightformer_tiny cannot take 7 px images" in _one_error_line(capsys)
    assert main(["analyze", tool, "--model", SMALL, "--model", "weightformer_tiny", "--img-size", "8", *out]) == 2
    assert "cannot take 8 px images" in _one_error_line(capsys) and ran == []
    assert not (tmp_path / "erf.png").exists()


def test_a_checkpoint_smaller_than_its_patch_and_counts_below_one_are_one_line(tmp_path, capsys):
    path = tmp_path / "best.pt"
    model = __import__("timm").create_model("weightformer_tiny", num_classes=3, patch_size=4, embed_dim=32, depth=2)
    torch.save({"model": model.state_dict(), "meta": {
        "task": "classification", "model": "weightformer_tiny", "model_kwargs": {"patch_size": 4, "embed_dim": 32,
                                                                                 "depth": 2},
        "num_classes": 3, "in_chans": 3, "img_size": 32}}, path)
    assert main(["analyze", "updates", "--model", f"ckpt={path}", "--img-size", "2"]) == 2
    assert "cannot take 2 px images" in _one_error_line(capsys)
    assert main(["analyze", "updates", "--model", SMALL, "--img-size", "16", "--num-images", "0"]) == 2
    assert "--num-images must be at least 1" in _one_error_line(capsys)
    assert main(["analyze", "interaction", "--model", "weightformer_tiny:patch_size=64"]) == 2  # 48 px default
    assert "cannot take 48 px images" in _one_error_line(capsys)


@pytest.mark.parametrize("task, model", [("detection", "weightformer_tiny"), ("segmentation", "weightformer_tiny"),
                                         ("generation", "dit_s")])
@pytest.mark.parametrize("tool", ["erf", "updates", "interaction"])
def test_a_checkpoint_of_another_task_is_one_line(task, model, tool, tmp_path, capsys):
    """A detection, segmentation or generation checkpoint is one line (not a KeyError: 'in_chans' nor "an
    unknown timm model"). The one reader (load_model(task="classification")) names the task and its command; given after
    a good model, it is found before that one is analysed."""
    path = tmp_path / f"{task}.pt"
    torch.save({"model": {}, "meta": {"task": task, "model": model, "model_kwargs": {}}}, path)
    out = ["--output", str(tmp_path / "erf.png")] if tool == "erf" else []
    size = ["--img-size", "32"]
    assert main(["analyze", tool, "--model", SMALL, "--model", f"ckpt={path}", *size, *out]) == 2
    err = _one_error_line(capsys)
    assert f"is a {task} checkpoint, not a classification one" in err
    assert "weightformer " + {"detection": "det", "segmentation": "seg", "generation": "gen"}[task] in err
    assert not (tmp_path / "erf.png").exists()


# --- ablate: nothing accepted and then silently wrong ------------------------------------------------
def _edit(path: str, variants=None, **recipe) -> None:
    config = yaml.safe_load(open(path))
    config["recipe"].update(recipe)
    config["variants"] = variants or config["variants"]
    open(path, "w").write(yaml.safe_dump(config))


def test_a_finished_run_of_an_edited_variant_is_refused_then_rerun_when_asked(tmp_path, capsys):
    """A finished run of a variant since edited is refused, not tabulated under the new definition, and rerun
    when asked."""
    path = _grid(tmp_path)
    assert main(["ablate", path]) == 0
    params = {r["variant"]: r["params"] for r in json.loads((tmp_path / "runs" / "table.json").read_text())["rows"]}
    record = json.loads((tmp_path / "runs" / "static" / "seed0" / "result.json").read_text())
    assert record["config"]["model_kwargs"]["dynamic_period"] == 0 and record["config"]["lr"] > 0  # resolved
    legacy = tmp_path / "runs" / "released" / "seed0" / "result.json"  # a result.json from before it held them
    legacy.write_text(json.dumps({k: v for k, v in json.loads(legacy.read_text()).items() if k != "config"}))
    capsys.readouterr()
    table = (tmp_path / "runs" / "table.json").read_text()

    _edit(path, {"released": {}, "static": {"model_kwargs": {"dynamic_period": 1}}})
    assert main(["ablate", path]) == 2
    err = _one_error_line(capsys)
    assert f"the finished run {tmp_path / 'runs' / 'static' / 'seed0'} was trained with other settings" in err
    assert "model_kwargs.dynamic_period 0 -> 1" in err and "--rerun-changed" in err
    assert (tmp_path / "runs" / "table.json").read_text() == table  # nothing retabulated

    assert main(["ablate", path, "--rerun-changed"]) == 0
    out = capsys.readouterr().out
    assert "train static seed 0 again: its settings changed (model_kwargs.dynamic_period 0 -> 1)" in out
    assert "skip released seed 0: finished" in out
    rows = {r["variant"]: r for r in json.loads((tmp_path / "runs" / "table.json").read_text())["rows"]}
    assert rows["static"]["params"] > params["released"] > params["static"]  # period 1: every block dynamic
    folder = tmp_path / "runs" / "static" / "seed0"
    assert json.loads((folder / "result.json").read_text())["config"]["model_kwargs"]["dynamic_period"] == 1
    kept = list(folder.glob("previous-*/last.pt")) + list(folder.glob("result.json.previous-*"))
    assert len(kept) == 2  # the old run moved aside, never deleted

    _edit(path, workers=1, log_interval=7)  # how a run is carried out, not what it computes
    assert main(["ablate", path]) == 0 and "skip static seed 0: finished" in capsys.readouterr().out
    _edit(path, lr=1e-3)  # a setting of every variant, in e-notation
    assert main(["ablate", path]) == 2
    assert "lr " in _one_error_line(capsys)


def test_an_interrupted_run_of_an_edited_variant_is_not_resumed_under_the_new_settings(tmp_path, capsys):
    path = _grid(tmp_path, {"static": {"model_kwargs": {"dynamic_period": 0}}})
    assert main(["ablate", path]) == 0
    (tmp_path / "runs" / "static" / "seed0" / "result.json").unlink()  # as if stopped before it finished
    capsys.readouterr()
    _edit(path, epochs=2)
    assert main(["ablate", path]) == 2
    assert "the interrupted run" in (err := _one_error_line(capsys)) and "epochs 1 -> 2" in err
    _edit(path, epochs=1, max_steps=50)  # a step limit leaves the schedule as it is: resume
    assert main(["ablate", path]) == 0 and "resumed from" in capsys.readouterr().out


def test_a_key_given_twice_in_the_grid_is_one_line(tmp_path, capsys):
    """Two variants of one name became one, silently (YAML keeps the last duplicate key)."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("output: runs\nvariants:\n  a: {model_kwargs: {embed_dim: 32}}\n  b: {}\n  a: {epochs: 2}\n")
    assert main(["ablate", str(grid)]) == 2
    assert "the key 'a' is given twice, at lines 3 and 5" in _one_error_line(capsys)
    grid.write_text("variants:\n  a: {model_kwargs: {depth: 2, depth: 3}}\n")
    assert main(["ablate", str(grid)]) == 2
    assert "the key 'depth' is given twice, at line 2, columns" in _one_error_line(capsys)
    # merge keys still override as YAML says, and numbers read as in every settings file (1e-3 is a float)
    assert load_yaml("x: &b {epochs: 1, lr: 1e-3}\ny: {<<: *b, epochs: 2}\n")["y"] == {"epochs": 2, "lr": 0.001}
    assert main(["ablate", _grid(tmp_path), "--seeds", "0", "0"]) == 2
    assert "seed(s) 0 twice" in _one_error_line(capsys)


@pytest.mark.parametrize("variant, message", [
    ({"model_kwargs": {"no_such_kwarg": 3}}, "does not take the model arguments"),
    ({"model_kwargs": {"patch_size": 64}}, "cannot take 32 px images"),
    ({"model": "deit_tiny_patch16_224", "model_kwargs": {"num_heads": 5}}, "dim should be divisible by num_heads"),
    ({"model": "no_such_model"}, "no_such_model"),
])
def test_every_variant_model_is_built_before_the_first_run(variant, message, tmp_path, monkeypatch, capsys):
    """A bad model kwarg of a later variant is found before the earlier variants train."""
    trained = []
    monkeypatch.setattr(ablate, "train_one", lambda *a, **k: trained.append(a))
    assert main(["ablate", _grid(tmp_path, {"good": {}, "bad": variant})]) == 2
    err = _one_error_line(capsys)
    assert message in err and "variant 'bad'" in err
    assert trained == [] and not (tmp_path / "runs" / "good").exists()


def test_the_variant_check_builds_on_the_meta_device(tmp_path, monkeypatch):
    """The check allocates no weights: a WeightFormer-B at 448 px costs it nothing."""
    from weightformer.classification import model as classification_model

    devices = []
    real = classification_model.build_classifier

    def spy(meta, pretrained=False):
        built = real(meta, pretrained)
        devices.append(next(built.parameters()).device.type)
        return built

    monkeypatch.setattr(classification_model, "build_classifier", spy)
    ablate.check_variant_model("base", {"data": "mnist", "model": "weightformer_base", "img_size": 448,
                                        "output": str(tmp_path)})
    assert devices == ["meta"]
