"""Whether a pair-relation classifier trained at 64 px reads its glyphs relative to the canvas's side edges: the
same held-out images with blank margin added on every side, and the probe redrawn at 128 px split by how far
its glyphs lie from the side edges.

    python benchmarks/examples/edge_margin.py RUN/seed0/last.pt RUN/seed1/last.pt --json OUT.json
    python benchmarks/examples/edge_margin.py RUN/seed0/last.pt --margins 4 8 12 16   # odd and even token counts
    python benchmarks/examples/edge_margin.py RUN/seed0/last.pt --margins 4 8 --crop-predictor-grid 1

For each checkpoint (trained on a pair relation, e.g. ``scale_match:size=64,scale=2``, with no background or
distractors) this prints accuracy and the AUC of the logit margin on:

- ``margin D``: the probe's held-out 64 px images with D px of blank canvas on every side (a 64 + 2D px canvas).
  The glyphs stay as far apart and as large as trained; only their distance to the canvas's edges grows. D is a
  multiple of the patch size, so every glyph keeps its place in its patch;
- ``drawn at 128, outer gap G``: the probe's held-out split redrawn at 128 px, grouped by the larger of the two
  glyphs' outer gaps (blank columns between a glyph's outer edge and its side of the canvas). The probe puts each
  glyph's outer edge within ``size // 16`` px of its side, so at 64 px the gap is 0-3 px and at 128 px 0-7 px.

If accuracy falls as D grows while the glyphs' own distance is unchanged, and on the 128 px drawing the images
whose gaps are as small as at 64 px keep the accuracy, the model's glyph code depends on where the glyph sits
relative to the edge (which the convs' zero padding marks), not on how far the two glyphs are apart.

``--crop-predictor-grid K`` is a swap test of the dynamic linear predictors' 2×2 pooling phase: every ΔW is
predicted from the token grid with K tokens cut from each side (the rest of the model sees the whole grid). With
K = 1 a margin of one token (4 px at patch 4) gives the predictor the trained canvas in its trained pooling phase,
and a margin of two tokens the canvas one token off it: if the phase costs the accuracy, odd and even margins swap
places; if the blank margin does, cutting it helps both.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from weightformer.atomic import write_atomic

from path_link_extent import score  # this folder's: accuracy, the AUC of the logit margin

MARGINS = (0, 4, 8, 16, 32)  # px of blank canvas on every side; 32 makes a 128 px canvas
LARGE = 128


def outer_gaps(images: torch.Tensor) -> np.ndarray:
    """(N,) the larger of the blank columns left of the leftmost ink and right of the rightmost ink, (N, 1, S, S)
    normalised images whose background is their minimum (no background option, no distractors)."""
    ink = (images[:, 0] > images.min()).any(dim=1).numpy()  # (N, S) columns that hold ink
    left = ink.argmax(axis=1)
    right = ink[:, ::-1].argmax(axis=1)
    return np.maximum(left, right)


def crop_predictor_grids(model: torch.nn.Module, tokens: int) -> int:
    """Make every dynamic linear layer of ``model`` predict its ΔW from the token grid with ``tokens`` cut from each
    side (its predictor's input, (B, H, W, C) -> (B, H - 2k, W - 2k, C)); the number of layers so changed."""
    from weightformer.layers import DynamicLinear

    def crop(_module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        grid = inputs[0]  # (B, H, W, C)
        if min(grid.shape[1:3]) <= 2 * tokens:
            raise ValueError(f"a {grid.shape[1]}x{grid.shape[2]} token grid has nothing left after cutting "
                             f"{tokens} from each side")
        return (grid[:, tokens:-tokens, tokens:-tokens], *inputs[1:])

    layers = [m for m in model.modules() if isinstance(m, DynamicLinear)]
    for layer in layers:
        layer.predictor.register_forward_pre_hook(crop)
    return len(layers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="weightformer train checkpoints of a pair relation at 64 px")
    parser.add_argument("--images", type=int, default=2000, help="held-out images per canvas")
    parser.add_argument("--margins", type=int, nargs="+", default=list(MARGINS),
                        help="px of blank canvas on every side (default: %(default)s); those off the patch grid skipped")
    parser.add_argument("--crop-predictor-grid", type=int, default=0, metavar="K",
                        help="predict every ΔW from the grid with K tokens cut from each side (a test of the "
                             "2x2 pooling's phase; default 0: the model as trained)")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.crop_predictor_grid < 0:
        parser.error(f"--crop-predictor-grid {args.crop_predictor_grid}: give a number of tokens, 0 or more")
    torch.set_num_threads(1)

    from weightformer.analysis.transfer import (checkpoint_probe, glyph_scale, insert_background, load_probe_classifier,
                                                probe_at, probe_batch)
    from weightformer.data.builtin import probe_spec
    from weightformer.data.probes import PAIR_RELATIONS

    record: dict = {"images": args.images, "margins": args.margins, "large": LARGE,
                    "crop_predictor_grid": args.crop_predictor_grid, "checkpoints": {}}
    for path in args.checkpoints:
        model, meta = load_probe_classifier(path)
        if args.crop_predictor_grid and not crop_predictor_grids(model, args.crop_predictor_grid):
            parser.error(f"{path}'s model has no dynamic linear layer: --crop-predictor-grid has nothing to crop")
        data = checkpoint_probe(meta, path)
        spec = probe_spec(data)
        if (data.partition(":")[0] not in PAIR_RELATIONS or spec.options.get("background", "none") != "none"
                or spec.options.get("distractors", 0)):
            parser.error(f"{path} was trained on {data!r}; pass checkpoints of a pair relation "
                         f"({', '.join(PAIR_RELATIONS)}) with no background and no distractors")
        patch = int(meta.get("model_kwargs", {}).get("patch_size", 16))
        small, labels = probe_batch(probe_at(f"{data},val={args.images}", spec.options["size"], glyph_scale(data)))
        row = record["checkpoints"][path] = {"data": data}
        side, blank = small.shape[-1], float(small.min())  # the trained canvas; its background pixel, normalised
        for margin in args.margins:
            if margin % patch:
                continue  # a margin off the patch grid would also move each glyph within its patch
            padded = insert_background(small, side + 2 * margin, "around", blank)  # (N, 1, side + 2 margin, ...)
            row[f"margin {margin}"] = scored = {**score(model, padded, labels), "images": len(labels)}
            print(f"{path} margin {margin} px ({side + 2 * margin} px canvas): "
                  f"{scored['accuracy']:.1f}%, AUC {scored['auc']:.3f}", flush=True)
        large, large_labels = probe_batch(probe_at(f"{data},val={args.images}", LARGE, glyph_scale(data)))
        gaps = outer_gaps(large)
        small_band = int(outer_gaps(small).max())  # the widest gap at the trained size
        for name, chosen in ((f"drawn at {LARGE}, all", np.ones_like(gaps, dtype=bool)),
                             (f"drawn at {LARGE}, outer gap <= {small_band} px", gaps <= small_band),
                             (f"drawn at {LARGE}, outer gap > {small_band} px", gaps > small_band)):
            if not chosen.any():
                continue  # no image with gaps that wide
            index = torch.from_numpy(np.flatnonzero(chosen))
            row[name] = scored = {**score(model, large[index], large_labels[index]), "images": len(index)}
            print(f"{path} {name}: {scored['accuracy']:.1f}%, AUC {scored['auc']:.3f} "
                  f"({scored['images']} images)", flush=True)
    if args.json:
        write_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
