"""Whether a ``path_link`` classifier trained at 64 px loses the relation to the larger canvas or to the longer
curves: the same held-out images placed on a 128 px canvas, against the probe redrawn at 128 px.

    python benchmarks/examples/path_link_extent.py RUN/seed0/last.pt RUN/seed1/last.pt --json OUT.json

The probe keeps its stroke width when the canvas grows and scales the curves with the side, so at 128 px the
curves are twice as long in pixels and in tokens. For each checkpoint (trained on ``path_link:size=64,scale=2``
with any ``ends``) this prints accuracy and the AUC of the logit margin (threshold-free, so a shift of every logit
with the canvas leaves it alone) on:

- ``drawn at 64``: the probe's held-out split at 64 px, as trained;
- ``centred on 128``, ``split on 128``: those images on a blank 128 px canvas, centred, or cut at the middle
  column with the halves moved to the edges (``weightformer.analysis.transfer.insert_background``): the canvas
  and the number of tokens double, the curves stay as they were. The split also cuts every curve that crosses
  the middle column, so a model that follows the curves may rightly answer otherwise there: it is a control for
  a pooled cue (which it leaves alone), while ``centred`` is the test for a model that learned the relation;
- ``drawn at 128``: the probe's held-out split redrawn at 128 px, the curves twice as long.

If the first three agree and only the last falls, what the model learned does not depend on the canvas (no pooled
statistic of the larger, emptier image moves it) but on how many tokens the curves span. Beside them, the effective
receptive field (``weightformer.analysis.erf``: the gradient of the centre token on ``--erf-images`` drawn images)
at 64 and 128 px: whether the model reaches across the canvas at all.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from weightformer.atomic import write_atomic

from path_link_cues import auc  # this folder's

LARGE = 128


def score(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Accuracy (%) and the AUC of the logit margin of ``model`` on normalised ``images`` (N, 1, S, S)."""
    with torch.no_grad():
        logits = torch.cat([model(images[i:i + 250]) for i in range(0, len(images), 250)])  # (N, 2)
    margin = (logits[:, 1] - logits[:, 0]).numpy()
    return {"accuracy": 100 * float((logits.argmax(-1) == labels).float().mean()),
            "auc": auc(margin, labels.numpy()), "mean_margin": float(np.mean(margin))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="+", help="weightformer train checkpoints of path_link at 64 px")
    parser.add_argument("--images", type=int, default=2000, help="held-out images per canvas")
    parser.add_argument("--erf-images", type=int, default=64, help="drawn images per size for the receptive field")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from weightformer.analysis.erf import erf_map, erf_stats
    from weightformer.analysis.transfer import (checkpoint_probe, glyph_scale, insert_background,
                                                load_probe_classifier, probe_at, probe_batch)
    from weightformer.data.builtin import probe_spec

    record: dict = {"images": args.images, "large": LARGE, "checkpoints": {}}
    for path in args.checkpoints:
        model, meta = load_probe_classifier(path)
        data = checkpoint_probe(meta, path)
        if data.partition(":")[0] != "path_link":
            parser.error(f"{path} was trained on {data!r}; pass checkpoints of path_link")
        small = f"{data},val={args.images}"
        images, labels = probe_batch(small)  # (N, 1, 64, 64)
        spec = probe_spec(small)
        blank = (0.0 - spec.mean[0]) / spec.std[0]  # an empty pixel, normalised
        conditions = {
            "drawn at 64": (images, labels),
            f"centred on {LARGE}": (insert_background(images, LARGE, "around", blank), labels),
            f"split on {LARGE}": (insert_background(images, LARGE, "between", blank), labels),
            f"drawn at {LARGE}": probe_batch(probe_at(small, LARGE, glyph_scale(data))),
        }
        row = record["checkpoints"][path] = {name: score(model, *batch) for name, batch in conditions.items()}
        print(path)
        for name, s in row.items():
            print(f"  {name:>15}: {s['accuracy']:5.1f}%  AUC {s['auc']:.3f}  mean margin {s['mean_margin']:+.2f}")
        erf = row["receptive field"] = {}
        for name in ("drawn at 64", f"drawn at {LARGE}"):
            field = erf_stats(*erf_map(model, conditions[name][0][:args.erf_images]))
            erf[name] = {**field.as_dict(), "half_diagonal_px": field.radius_90 / field.radius_90_rel}
            print(f"  {name:>15}: receptive field radius {field.radius_50:.1f} px (50%), {field.radius_90:.1f} px "
                  f"(90%) of {erf[name]['half_diagonal_px']:.1f}; {field.outside_center:.0%} outside the central box")
    if args.json:
        write_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
