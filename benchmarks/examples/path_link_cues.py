"""What a ``path_link`` classifier can read without following a curve, and what trained ones read.

    python benchmarks/examples/path_link_cues.py                          # the marker-distance cue alone
    python benchmarks/examples/path_link_cues.py RUN/seed0/last.pt ...    # and each checkpoint beside it
    python benchmarks/examples/path_link_cues.py --ends matched           # the probe drawn with ends=matched

The label of ``path_link`` is whether the two markers end the same curve. The generator keeps the markers at
least a quarter of the canvas apart; with ``ends=free`` (its default) it does not match their distance between
the classes, so the distance alone says something about the label, and ``ends=matched`` is meant to remove that.
For each canvas size (64 and 128 px at stroke width 2, the suite's train-small / run-large protocol) this prints:

- the best accuracy of one threshold on the markers' distance (as a share of the side), chosen on one draw of
  the probe and scored on another (the probe's own held-out split);
- how often the two curves lie in the same or neighbouring cells (8-adjacent) of a grid of 1, 2, 4 and 8 px cells:
  on those images a 3 × 3 conv over such a grid (one cell per token at that patch size) cannot follow one curve
  without seeing the other from the cells next to it;
- for each checkpoint: its accuracy, the AUC of its logit margin (threshold-free: a shift of every logit
  with the canvas leaves it alone) and how often its answer agrees with the best distance threshold for its
  own answers, against the agreement its rate of answering 1 gives by chance.

The markers are found in the images, not taken from the generator: an erosion by a 5 × 5 square keeps the
(2·width + 3) px square markers and removes the width-2 curves; the two largest blobs left are the markers
(a curve that crosses itself leaves a pixel or two).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F

from weightformer.atomic import write_atomic

SIZES = (64, 128)
WIDTH = 2  # the suite's stroke width (scale=2)
CELLS = (1, 2, 4, 8)  # grid cells (px) for curves_in_neighbouring_cells


def _blobs(ys: np.ndarray, xs: np.ndarray) -> list[np.ndarray]:
    """8-connected groups of the pixels (ys[i], xs[i]), largest first: lists of indices."""
    near = np.maximum(abs(ys[:, None] - ys[None]), abs(xs[:, None] - xs[None])) <= 1  # (n, n) neighbours
    group = np.arange(len(ys))
    while True:  # each pixel takes the smallest group id among its neighbours until nothing changes
        merged = np.where(near, group[None], len(ys)).min(axis=1)
        if (merged == group).all():
            break
        group = merged
    return sorted((np.nonzero(group == g)[0] for g in np.unique(group)), key=len, reverse=True)


def marker_distance(images: np.ndarray) -> np.ndarray:
    """(N, S, S) uint8 path_link images -> (N,) distance between the two markers' centres, as a share of S (NaN
    where two markers are not found)."""
    ink = torch.from_numpy(images > 0).float()[:, None]  # (N, 1, S, S)
    core = -F.max_pool2d(-ink, 5, stride=1, padding=2) > 0.5  # erosion: the markers' centres (3 x 3) survive
    out = np.empty(len(images))
    for i, mask in enumerate(core[:, 0].numpy()):
        ys, xs = np.nonzero(mask)
        blobs = _blobs(ys, xs) if len(ys) else []
        # a curve crossing itself can leave a pixel or two; a marker leaves 9
        if len(blobs) < 2 or len(blobs[1]) < 6 or (len(blobs) > 2 and len(blobs[2]) >= 6):
            out[i] = np.nan  # a marker cut by the canvas edge, or a thick self-crossing: about 0.2% of images
            continue
        (ay, ax), (by, bx) = [(ys[b].mean(), xs[b].mean()) for b in blobs[:2]]
        out[i] = np.hypot(ay - by, ax - bx) / images.shape[-1]
    if np.isnan(out).mean() > 0.05:
        raise RuntimeError(f"no two markers in {np.isnan(out).mean():.0%} of the images: are they path_link images "
                           f"drawn with stroke width {WIDTH}?")
    return out


def curves_in_neighbouring_cells(images: np.ndarray, cells: tuple[int, ...] = CELLS) -> dict[int, np.ndarray]:
    """(N, S, S) path_link images -> {cell: (N,) bool}: whether the two largest 8-connected ink groups (the
    curves, markers included) occupy the same or 8-adjacent cells of a grid of ``cell`` px cells."""
    out = {cell: np.zeros(len(images), bool) for cell in cells}
    for i, image in enumerate(images):
        ys, xs = np.nonzero(image)
        masks = torch.zeros(2, 1, *image.shape)  # (2, 1, S, S): one curve each
        for k, group in enumerate(_blobs(ys, xs)[:2]):
            masks[k, 0, ys[group], xs[group]] = 1
        for cell in cells:
            grid = F.max_pool2d(masks, cell, ceil_mode=True)  # (2, 1, S / cell, S / cell)
            grown = F.max_pool2d(grid[:1], 3, stride=1, padding=1)  # the first curve's cells and their neighbours
            out[cell][i] = bool((grown * grid[1:]).any())
    return out


def best_threshold(distance: np.ndarray, target: np.ndarray) -> tuple[float, bool, float]:
    """The threshold t and side (True: 1 below t) that best predict ``target`` from ``distance``: (t, below, acc)."""
    best = (0.0, True, 0.0)
    for t in np.unique(distance):
        for below in (True, False):
            acc = float((predict((t, below, 0.0), distance) == target).mean())
            if acc > best[2]:
                best = (float(t), below, acc)
    return best


def predict(threshold: tuple[float, bool, float], distance: np.ndarray) -> np.ndarray:
    t, below, _ = threshold
    return ((distance < t) == below).astype(int)


def auc(score: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U / n₀n₁; ties broken by order, negligible for float logits)."""
    ranks = np.empty(len(score))
    ranks[np.argsort(score)] = np.arange(1, len(score) + 1)
    n1 = int(labels.sum())
    n0 = len(labels) - n1
    return float((ranks[labels == 1].sum() - n1 * (n1 + 1) / 2) / (n0 * n1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", help="weightformer train checkpoints of path_link:size=64,scale=2")
    parser.add_argument("--images", type=int, default=4000, help="held-out images per size")
    parser.add_argument("--ends", choices=["free", "matched"], default="free", help="the probe's ends= option")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from weightformer.analysis.transfer import load_probe_classifier
    from weightformer.data import open_dataset
    from weightformer.data.probes import path_link

    record: dict = {"images": args.images, "width": WIDTH, "ends": args.ends, "sizes": {}}
    for size in SIZES:
        # the threshold is fitted on a draw of its own and scored on the probe's held-out split
        fit_images, fit_labels = path_link(args.images, size=size, seed=1000, scale=WIDTH, ends=args.ends)
        spec = f"path_link:size={size},scale={WIDTH},ends={args.ends},train=1,val={args.images}"
        info, splits = open_dataset(spec, splits=("val",))
        images, labels = splits["val"].images, splits["val"].labels
        distance = marker_distance(images)
        found = ~np.isnan(distance)  # the images scored below
        fit_distance = marker_distance(fit_images)
        fit_found = ~np.isnan(fit_distance)
        cue = best_threshold(fit_distance[fit_found], fit_labels[fit_found])
        images, labels, distance = images[found], labels[found], distance[found]
        row = {"images_with_two_markers": int(found.sum()),
               "distance_cue": {"threshold": cue[0], "label_1_below": cue[1],
                                "accuracy": 100 * float((predict(cue, distance) == labels).mean())},
               "mean_distance": {str(k): float(distance[labels == k].mean()) for k in (0, 1)},
               "curves_in_neighbouring_cells": {str(c): 100 * float(near.mean())
                                                for c, near in curves_in_neighbouring_cells(images).items()},
               "checkpoints": {}}
        print(f"{size} px ({found.sum()} of {len(found)} images with two markers found): markers "
              f"{row['mean_distance']['0']:.3f} (label 0) / {row['mean_distance']['1']:.3f} (label 1) of the side "
              f"apart; one distance threshold ({cue[0]:.3f}) scores {row['distance_cue']['accuracy']:.1f}%; the "
              f"curves in the same or neighbouring cells of " + ", ".join(
                  f"{c} px: {v:.1f}%" for c, v in row["curves_in_neighbouring_cells"].items()))
        x = (torch.from_numpy(images).float().div(255)[:, None] - info.mean[0]) / info.std[0]  # (N, 1, S, S)
        for path in args.checkpoints:
            model, _ = load_probe_classifier(path)
            with torch.no_grad():
                logits = torch.cat([model(x[i:i + 250]) for i in range(0, len(x), 250)])
            margin = (logits[:, 1] - logits[:, 0]).numpy()
            answer = (margin > 0).astype(int)
            follows = best_threshold(distance, answer)  # the distance threshold closest to the model's answers
            p = answer.mean()
            chance = max(p, 1 - p)  # agreement of a constant answer
            row["checkpoints"][path] = {"accuracy": 100 * float((answer == labels).mean()), "auc": auc(margin, labels),
                                        "answers_1": 100 * float(p), "agrees_with_distance": 100 * follows[2],
                                        "agreement_by_chance": 100 * float(chance)}
            c = row["checkpoints"][path]
            print(f"  {path}: {c['accuracy']:.1f}%, AUC {c['auc']:.3f}, answers 1 on {c['answers_1']:.0f}%; "
                  f"a distance threshold matches its answers on {c['agrees_with_distance']:.1f}% "
                  f"(a constant answer: {c['agreement_by_chance']:.1f}%)")
        record["sizes"][str(size)] = row
    if args.json:
        write_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
