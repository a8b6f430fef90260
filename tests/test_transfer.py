"""Resolution transfer of the probes: the probes' fixed glyph ``scale``, background insertion, the swap
diagnosis and ``weightformer analyze transfer`` (weightformer.analysis.transfer)."""

import json
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import weightformer  # noqa: F401  (registers the models)
from weightformer.analysis.transfer import glyph_scale, insert_background, probe_at, swap_diagnosis
from weightformer.cli import main
from weightformer.data import BUILTIN_DATASETS, DataError, open_dataset
from weightformer.data.probes import GLYPH_BANK, glyph_count, glyph_match


def _boxes(image: np.ndarray) -> list[np.ndarray]:
    """The ink of the left and right half, each cropped to its bounding box."""
    out = []
    for part in (image[:, : image.shape[1] // 2] > 0, image[:, image.shape[1] // 2:] > 0):
        rows, cols = np.nonzero(part)
        out.append(part[rows.min():rows.max() + 1, cols.min():cols.max() + 1])
    return out


def test_an_explicit_scale_equal_to_the_default_draws_the_same_images():
    a, la = glyph_match(30, size=64, seed=2)
    b, lb = glyph_match(30, size=64, seed=2, scale=2)
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    c, _ = glyph_count(10, size=64, seed=2)
    d, _ = glyph_count(10, size=64, seed=2, scale=2)
    assert np.array_equal(c, d)


def test_a_larger_canvas_at_a_fixed_scale_draws_the_64px_glyphs_farther_apart():
    images, labels = glyph_match(40, size=128, seed=1, scale=2)
    bank = [np.kron(g, np.ones((2, 2), bool)) for g in GLYPH_BANK]
    for image, label in zip(images, labels):
        left, right = _boxes(image)
        assert left.shape == right.shape == (10, 10)  # 5 cells of 2 px, as at 64 px (not 4 px as by default)
        assert any(np.array_equal(left, g) for g in bank) and any(np.array_equal(right, g) for g in bank)
        assert np.array_equal(left, right) == bool(label)
        cols = np.nonzero(image.any(0))[0]
        assert cols.min() < 128 // 16 and cols.max() >= 128 - 128 // 16 - 1  # each in its edge band
    default, _ = glyph_match(4, size=128, seed=1)
    assert _boxes(default[0])[0].shape == (20, 20)  # without scale the glyphs grow with the canvas


def test_scale_is_a_probe_option_and_an_undrawable_canvas_is_one_line(tmp_path, capsys):
    info, splits = open_dataset("glyph_match:size=96,scale=2,train=4,val=4")
    assert splits["val"].images.shape[1:] == (96, 96) and glyph_scale("glyph_match:size=96,scale=2") == 2
    assert glyph_scale("glyph_match:size=96") == 3 and glyph_scale("path_link") == 2
    with pytest.raises(DataError, match="cannot draw two 20 px glyphs"):
        BUILTIN_DATASETS["glyph_match:size=32,scale=4"]
    with pytest.raises(DataError, match="cannot place 4"):
        BUILTIN_DATASETS["glyph_count:size=32,scale=3"]
    with pytest.raises(DataError, match="scale must be at least 1"):
        BUILTIN_DATASETS["glyph_match:scale=0"]
    code = main(["train", "--data", "glyph_match:size=32,scale=4", "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "cannot draw" in err[0]


def test_probe_at_keeps_the_other_options():
    assert probe_at("glyph_match:glyphs=2,size=64,val=10", 128, 2) == "glyph_match:glyphs=2,val=10,size=128,scale=2"
    with pytest.raises(DataError, match="cannot draw"):
        probe_at("glyph_match", 32, 4)
    # A range of glyph cells (varied glyph sizes) is carried to the larger canvas as it was written.
    ranged = "mirror_match:size=64,scale=2-3,background=clutter"
    assert glyph_scale(ranged) == (2, 3)
    assert probe_at(ranged, 128, glyph_scale(ranged)) == "mirror_match:background=clutter,size=128,scale=2-3"


@pytest.mark.parametrize("layout", ["between", "around"])
def test_inserted_background_keeps_every_glyph_pixel(layout):
    images, labels = glyph_match(8, size=64, seed=0)
    small = torch.from_numpy(images).float()[:, None]  # (8, 1, 64, 64), background 0
    large = insert_background(small, 128, layout, background=0.0)
    assert large.shape == (8, 1, 128, 128)
    for before, after, label in zip(images, large[:, 0].numpy(), labels):
        assert after.sum() == before.sum()  # no ink lost or added
        left, right = _boxes(after)
        assert np.array_equal(left, right) == bool(label)
        cols = np.nonzero(after.any(0))[0]
        if layout == "between":  # each glyph keeps its distance to its side edge
            assert cols.min() == np.nonzero(before.any(0))[0].min()
            assert 127 - cols.max() == 63 - np.nonzero(before.any(0))[0].max()
        else:
            assert cols.min() >= 32 and cols.max() < 96
    with pytest.raises(ValueError, match="layout"):
        insert_background(small, 32, layout, 0.0)


def _tiny_probe_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("weightformer_long_range_tiny", patch_size=4, embed_dim=16, depth=2, img_size=32,
                             in_chans=1, num_classes=2).eval()


def test_swap_diagnosis_is_exact_where_it_must_be():
    model = _tiny_probe_model()
    torch.manual_seed(1)
    images, labels = torch.randn(6, 1, 32, 32), torch.tensor([0, 1, 0, 1, 1, 0])
    same = swap_diagnosis(model, images, labels, 32, "around", background=0.0)  # nothing inserted
    assert all(c["change"] == 0.0 for c in same["changes"].values())
    assert same["accuracy"]["small"] == same["accuracy"]["large"]
    grown = swap_diagnosis(model, images, labels, 64, "between", background=-0.25)
    names = set(grown["changes"])
    assert {"blocks.0.dwc", "blocks.0.mlp.fc1", "blocks.1.dwc", "blocks.1.mlp.fc1", "pool", "logits"} == names
    assert grown["changes"]["logits"]["change"] > 0
    # the head's pooled feature swapped in means the small image's logits: its accuracy exactly
    assert grown["accuracy"]["large, swapped in"]["pool"] == grown["accuracy"]["small"]
    assert set(grown["accuracy"]["large, swapped in"]) >= {"all linear", "all dwc", "all dynamic"}


@pytest.fixture
def examples_on_path(monkeypatch):
    """benchmarks/examples importable, as its scripts import one another, for one test."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks" / "examples"))


@pytest.fixture(scope="module")
def probe_checkpoint(tmp_path_factory):
    """A 96 px glyph_match classifier (glyph scale 3) after one step, and an MNIST one."""
    root = tmp_path_factory.mktemp("transfer")
    common = ["--epochs", "1", "--max-steps", "1", "--batch-size", "8", "--model-kwargs", "patch_size=8", "embed_dim=16",
              "depth=2"]
    assert main(["train", "--data", "glyph_match:size=96,train=8,val=8", *common, "--output", str(root / "probe")]) == 0
    return root


def test_analyze_transfer_writes_the_table_and_plot(probe_checkpoint, capsys):
    out = probe_checkpoint / "t.png"
    code = main(["analyze", "transfer", "--model", f"ckpt={probe_checkpoint / 'probe' / 'last.pt'}", "--sizes", "96",
                 "128", "--val", "20", "--diagnose", "4", "--output", str(out)])
    assert code == 0
    table = json.loads(out.with_suffix(".json").read_text())
    row = table["rows"][0]
    assert table["sizes"] == [96, 128] and set(row["accuracy"]) == {"96", "128"}
    assert row["drawn"] == ["glyph_match:train=8,val=20,size=96,scale=3", "glyph_match:train=8,val=20,size=128,scale=3"]
    assert [d["size"] for d in row["diagnosis"]] == [128, 128]
    assert out.is_file() and "| probe/last.pt |" in out.with_suffix(".md").read_text()
    assert main(["analyze", "transfer", "--model", f"ckpt={probe_checkpoint / 'probe' / 'last.pt'}",
                 "--output", str(out)]) == 2  # the outputs exist: refused without --overwrite
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--model", "weightformer_tiny"], "write ckpt=PATH"),
    (["--model", "ckpt=missing.pt"], "no such checkpoint file"),
    (["--model", "ckpt={probe}", "--sizes", "32", "96"], "cannot draw two 15 px glyphs"),
])
def test_analyze_transfer_refuses_bad_input_in_one_line(probe_checkpoint, capsys, args, message):
    args = [a.format(probe=probe_checkpoint / "probe" / "last.pt") for a in args]
    code = main(["analyze", "transfer", *args, "--output", str(probe_checkpoint / "bad.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_analyze_transfer_refuses_a_checkpoint_that_is_not_a_probe_classifier(tmp_path, capsys):
    assert main(["train", "--data", "mnist", "--epochs", "1", "--max-steps", "1", "--batch-size", "8", "--model-kwargs",
                 "embed_dim=16", "depth=1", "--output", str(tmp_path / "mnist")]) == 0
    capsys.readouterr()
    code = main(["analyze", "transfer", "--model", f"ckpt={tmp_path / 'mnist' / 'last.pt'}",
                 "--output", str(tmp_path / "t.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a probe classifier" in err[0], err


def test_a_vit_position_embedding_is_resampled_to_the_new_grid_as_timm_does():
    from timm.layers import resample_abs_pos_embed

    from weightformer.analysis.transfer import _fit_grid

    torch.manual_seed(0)
    vit = timm.create_model("deit_tiny_patch16_224", patch_size=4, embed_dim=16, depth=1, num_heads=2, img_size=32,
                            in_chans=1, num_classes=2).eval()
    expected = resample_abs_pos_embed(vit.pos_embed.detach(), (16, 16), (8, 8), num_prefix_tokens=1)
    _fit_grid(vit, 64)
    torch.testing.assert_close(vit.pos_embed.detach(), expected)
    assert vit(torch.randn(1, 1, 64, 64)).shape == (1, 2)
    wf = _tiny_probe_model()
    before = {k: v.clone() for k, v in wf.state_dict().items()}
    _fit_grid(wf, 64)  # no position embedding: nothing to change
    assert all(torch.equal(before[k], v) for k, v in wf.state_dict().items())


def test_path_link_extent_scores_the_same_images_on_a_larger_canvas_and_the_redrawn_probe(examples_on_path,
                                                                                           probe_checkpoint, tmp_path,
                                                                                           capsys):
    import path_link_extent
    from path_link_cues import auc

    assert main(["train", "--data", "path_link:size=64,train=8,val=8", "--epochs", "1", "--max-steps", "1",
                 "--batch-size", "8", "--model-kwargs", "patch_size=8", "embed_dim=16", "depth=2",
                 "--output", str(tmp_path / "link")]) == 0
    ckpt, out = str(tmp_path / "link" / "last.pt"), tmp_path / "extent.json"
    assert path_link_extent.main([ckpt, "--images", "16", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["checkpoints"][ckpt]
    assert list(row) == ["drawn at 64", "centred on 128", "split on 128", "drawn at 128", "receptive field"]
    field = row["receptive field"]["drawn at 128"]
    assert 0 < field["radius_90"] <= field["half_diagonal_px"] + 1
    assert all(0 <= s["accuracy"] <= 100 and 0 <= s["auc"] <= 1 for k, s in row.items() if k != "receptive field")
    # the AUC is the share of (label 1, label 0) pairs ranked right: counted pair by pair here
    rng = np.random.default_rng(0)
    score, labels = rng.normal(size=40), np.arange(40) % 2
    pairs = [(p > n) for p in score[labels == 1] for n in score[labels == 0]]
    assert auc(score, labels) == pytest.approx(np.mean(pairs))
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # a probe that is not path_link
        path_link_extent.main([str(probe_checkpoint / "probe" / "last.pt")])
    assert refused.value.code == 2 and "pass checkpoints of path_link" in capsys.readouterr().err


def test_looped_blocks_apply_the_block_stack_the_given_number_of_times(examples_on_path, monkeypatch):
    import looped_blocks

    from weightformer.models.weightformer import WeightFormer

    torch.manual_seed(0)
    model = timm.create_model("weightformer_long_range_tiny", patch_size=8, embed_dim=16, depth=2, in_chans=1,
                              num_classes=2, img_size=32).eval()
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        tokens = model.norm_pre(model.patch_embed(x))  # (B, 4, 4, C): the embedding, by hand
        for _ in range(3):
            for block in model.blocks:
                tokens = block(tokens)
        expected = model.head(model.norm(tokens).mean(dim=(1, 2)))
    monkeypatch.setattr(WeightFormer, "forward_features", WeightFormer.forward_features)  # restored after the test
    monkeypatch.setitem(looped_blocks.PASSES, "fixed", 3)
    looped_blocks.loop_blocks()
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)


def test_propagator_carries_a_token_one_step_per_pass_and_runs_after_the_blocks(examples_on_path, monkeypatch):
    import looped_blocks

    from weightformer.models.weightformer import WeightFormer

    torch.manual_seed(0)
    cell = looped_blocks.Propagator(8, 4, patch=4, stride=4, in_chans=1)  # one cell per token
    torch.nn.init.normal_(cell.write.weight)  # built as zero (the block stack alone); any map for the test
    x = torch.randn(1, 9, 9, 8)
    poked = x.clone()
    poked[0, 4, 4] += 1.0  # one token changed, in the middle
    with torch.no_grad():
        for passes in (1, 2, 3):
            moved = (cell(poked, passes) - cell(x, passes)).abs().amax(-1)[0] > 0  # (9, 9)
            # the change reaches every token within `passes` rows and columns of the poked one, and no farther
            near = torch.zeros(9, 9, dtype=torch.bool)
            near[4 - passes:5 + passes, 4 - passes:5 + passes] = True
            assert torch.equal(moved, near), passes
        assert cell(x * 1e4, 50).sub(x * 1e4).abs().max() <= cell.write.weight.abs().sum(1).max() + \
            cell.write.bias.abs().max() + 1e-3  # the state stays in (-1, 1)
        # cells of 2 px under 4 px tokens: a pixel poked in the image moves the cells `passes` cells around its
        # own (a pixel at 17 px: cell 8, token 4), and after max-pooling at most the tokens those cells lie in
        fine = looped_blocks.Propagator(8, 4, patch=4, stride=2, in_chans=1)
        torch.nn.init.normal_(fine.write.weight)
        image = torch.randn(1, 1, 36, 36)
        pixel = image.clone()
        pixel[0, 0, 17, 17] += 1.0
        for passes, span in ((1, slice(3, 5)), (2, slice(3, 6)), (5, slice(1, 7))):  # cells 7-9, 6-10, 3-13
            moved = (fine(x, passes, pixel) - fine(x, passes, image)).abs().amax(-1)[0] > 0
            near = torch.zeros(9, 9, dtype=torch.bool)
            near[span, span] = True
            assert moved[4, 4] and not (moved & ~near).any(), passes
    # --grad-passes: in training only the last K passes build a graph; in eval none, whatever K
    graphed = []
    cell.spatial.register_forward_hook(lambda module, args, out: graphed.append(out.requires_grad))
    monkeypatch.setitem(looped_blocks.PASSES, "grad", 2)
    cell.train()(x, 5).sum().backward()
    assert graphed == [False, False, False, True, True] and cell.gates.weight.grad is not None
    graphed.clear()
    with torch.no_grad():
        cell.eval()(x, 3)
    assert graphed == [False] * 3

    monkeypatch.setattr(WeightFormer, "__init__", WeightFormer.__init__)  # both restored after the test
    monkeypatch.setattr(WeightFormer, "forward_features", WeightFormer.forward_features)
    monkeypatch.setitem(looped_blocks.PASSES, "fixed", 5)
    looped_blocks.loop_blocks(propagator=4)
    model = timm.create_model("weightformer_long_range_tiny", patch_size=8, embed_dim=16, depth=2, in_chans=1,
                              num_classes=2, img_size=32).eval()
    torch.nn.init.normal_(model.propagator.write.weight)
    image = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        tokens = model.norm_pre(model.patch_embed(image))  # (B, 4, 4, C)
        for block in model.blocks:  # once
            tokens = block(tokens)
        expected = model.head(model.norm(model.propagator(tokens, 5)).mean(dim=(1, 2)))
        torch.testing.assert_close(model(image), expected)
    assert "propagator.gates.weight" in model.state_dict()  # saved with the checkpoint


def test_path_link_cues_counts_curves_that_a_grid_puts_in_neighbouring_cells(examples_on_path):
    from path_link_cues import curves_in_neighbouring_cells

    images = np.zeros((2, 16, 16), np.uint8)  # two vertical 2 px strokes each: columns 5-6 and then
    images[:, 2:13, 5:7] = 255
    images[0, 2:13, 9:11] = 255  # 9-10 (2 blank columns between)
    images[1, 2:13, 13:15] = 255  # 13-14 (6 blank columns)
    # cells of 1 px: columns {5, 6} and {9, 10} / {13, 14}; of 2 px: cells {2, 3} and {4, 5} / {6, 7};
    # of 4 px: 1 and 2 / 3; of 8 px: 0 and 1 / 1
    expected = {1: [False, False], 2: [True, False], 4: [True, False], 8: [True, True]}
    assert {cell: near.tolist() for cell, near in curves_in_neighbouring_cells(images).items()} == expected


def test_edge_margin_pads_the_same_images_and_splits_the_large_drawing_by_outer_gap(examples_on_path, probe_checkpoint,
                                                                                     tmp_path, capsys):
    import edge_margin

    # outer gaps: blank columns outside the outermost ink, the larger side; counted by hand on a 10 px canvas
    canvas = torch.zeros(2, 1, 10, 10)
    canvas[0, 0, 4, 2], canvas[0, 0, 7, 8] = 1, 1  # gaps 2 (left) and 1 (right)
    canvas[1, 0, 0, 0], canvas[1, 0, 9, 4] = 1, 1  # gaps 0 and 5
    assert edge_margin.outer_gaps(canvas).tolist() == [2, 5]
    padded = insert_background(canvas - 0.5, 16, "around", -0.5)  # the script's margin of 3 px: the image centred
    assert padded.shape == (2, 1, 16, 16) and torch.equal(padded[..., 3:13, 3:13], canvas - 0.5)
    assert edge_margin.outer_gaps(padded).tolist() == [5, 8]
    # the probe's band: a glyph's outer edge within size // 16 px of its side
    for size in (64, 128):
        images = torch.from_numpy(glyph_match(200, size=size, seed=1, scale=2)[0]).float()[:, None]
        gaps = edge_margin.outer_gaps(images)
        assert gaps.max() == size // 16 - 1

    ckpt, out = str(probe_checkpoint / "probe" / "last.pt"), tmp_path / "margin.json"
    assert edge_margin.main([ckpt, "--images", "16", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["checkpoints"][ckpt]
    assert [k for k in row if k.startswith("margin")] == ["margin 0", "margin 8", "margin 16", "margin 32"]  # patch 8
    drawn = [row[k] for k in row if k.startswith("drawn at 128")]
    assert len(drawn) == 3 and drawn[0]["images"] == 16 == drawn[1]["images"] + drawn[2]["images"]
    assert all(0 <= s["accuracy"] <= 100 for k, s in row.items() if k != "data")
    assert edge_margin.main([ckpt, "--images", "16", "--margins", "8", "12", "24", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["checkpoints"][ckpt]
    assert [k for k in row if k.startswith("margin")] == ["margin 8", "margin 24"]  # 12 is off the patch grid
    capsys.readouterr()
    assert main(["train", "--data", "glyph_match:size=64,background=noise,train=8,val=8", "--epochs", "1",
                 "--max-steps", "1", "--batch-size", "8", "--model-kwargs", "patch_size=8", "embed_dim=16", "depth=2",
                 "--output", str(tmp_path / "noisy")]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # a background leaves no blank columns to count
        edge_margin.main([str(tmp_path / "noisy" / "last.pt")])
    assert refused.value.code == 2 and "with no background and no distractors" in capsys.readouterr().err


def test_edge_margin_crops_what_every_dynamic_linear_predictor_reads_and_nothing_else(examples_on_path,
                                                                                      probe_checkpoint, tmp_path):
    import edge_margin
    from weightformer.layers import DynamicLinear

    torch.manual_seed(0)
    model = timm.create_model("weightformer_long_range_tiny", num_classes=2, img_size=32, patch_size=4, embed_dim=32,
                              depth=2, drop_path_rate=0.0).eval()
    x = torch.randn(2, 3, 32, 32)
    seen = []  # every predictor's input grid (after any pre-hook's crop) and output
    layers = [m for m in model.modules() if isinstance(m, DynamicLinear)]
    for layer in layers:
        layer.predictor.register_forward_hook(lambda m, inputs, out: seen.append((m, inputs[0].clone(), out)))
    with torch.no_grad():
        plain = model(x)
        uncropped = [grid for _, grid, _ in seen]
        seen.clear()
        assert edge_margin.crop_predictor_grids(model, 1) == len(layers) == 2
        cropped = model(x)
    assert [grid.shape[1:3] for _, grid, _ in seen] == [(6, 6)] * 2  # the 8x8 grid less one token on every side
    assert not torch.allclose(plain, cropped)
    # The first block's predictor reads the embedded image's grid, cropped: ΔW is its prediction from that crop.
    first, grid, delta = seen[0]
    torch.testing.assert_close(grid, uncropped[0][:, 1:-1, 1:-1])
    with torch.no_grad():
        first._forward_pre_hooks.clear()
        torch.testing.assert_close(delta, first(uncropped[0][:, 1:-1, 1:-1]))
    with pytest.raises(ValueError, match="nothing left after cutting 4 from each side"):
        edge_margin.crop_predictor_grids(model, 4)
        model(x)
    ckpt, out = str(probe_checkpoint / "probe" / "last.pt"), tmp_path / "cropped.json"  # the released design
    assert edge_margin.main([ckpt, "--images", "16", "--margins", "8", "--crop-predictor-grid", "1",
                             "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["crop_predictor_grid"] == 1 and "margin 8" in record["checkpoints"][ckpt]
    with pytest.raises(SystemExit) as refused:
        edge_margin.main([ckpt, "--crop-predictor-grid", "-1"])
    assert refused.value.code == 2
