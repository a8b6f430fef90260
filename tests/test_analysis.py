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
    monkeypatch.setattr(ablate, "train_one", lambda c, v, s: calls.append(v) or real_train(c, v, s))
    assert main(["ablate", path]) == 0
    assert calls == ["static"]
    log = capsys.readouterr().out
    assert "skip released seed 0: finished" in log and "resumed from" in log
    again = json.loads((tmp_path / "runs" / "static" / "seed0" / "result.json").read_text())
    assert again["top1_last"] == first["top1_last"]  # nothing retrained: the same evaluated epoch


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
