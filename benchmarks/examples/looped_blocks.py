"""An experiment (no option of the package): WeightFormer's block stack applied several times with shared weights,
so that the number of passes, and with it how far a static 3 × 3 conv carries a token, can grow with the canvas.

    python benchmarks/examples/looped_blocks.py train --data path_link:size=64,scale=2,ends=matched \\
        --model weightformer_long_range_tiny --model-kwargs patch_size=4 embed_dim=64 depth=2 drop_path_rate=0.0 \\
        --seed 0 --output RUN/seed0
    python benchmarks/examples/looped_blocks.py score RUN/seed0/last.pt RUN/seed1/last.pt --json OUT.json

``train`` is ``weightformer train`` with every WeightFormer's ``forward_features`` looped: each training batch
takes a number of passes drawn from ``--passes-lo``..``--passes-hi`` (2..4) by torch's generator, so the blocks
learn to be applied any number of times (as in Schwarzschild et al., 2021, "Can You Learn an Algorithm?", trained
on small mazes and run longer on large ones). ``score`` evaluates looped checkpoints at fixed pass counts on the
checkpoint's probe drawn at 64 and at 128 px: accuracy and the AUC of the logit margin per (size, passes).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from weightformer.atomic import write_atomic

PASSES = {"lo": 2, "hi": 4, "fixed": None}  # training draws lo..hi; "fixed" (an int) overrides in eval mode


def loop_blocks() -> None:
    """Replace WeightFormer.forward_features by the looped one (this process only)."""
    from weightformer.models.weightformer import WeightFormer

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:  # (B, C_in, H_img, W_img) -> (B, H, W, C)
        x = self._embed(x)
        if self.training:
            passes = int(torch.randint(PASSES["lo"], PASSES["hi"] + 1, ()).item())
        else:
            passes = PASSES["fixed"] or (PASSES["lo"] + PASSES["hi"]) // 2
        for _ in range(passes):
            for block in self.blocks:
                x = block(x)
        return self.norm(x)

    WeightFormer.forward_features = forward_features


def score(paths: list[str], plan: list[tuple[int, int]], images: int) -> dict[str, dict[str, list[float]]]:
    """{checkpoint: {"SIZEpx xPASSES": [accuracy %, AUC]}} on ``images`` held-out images per size."""
    from path_link_extent import score as score_batch  # this folder's

    from weightformer.analysis.transfer import (checkpoint_probe, glyph_scale, load_probe_classifier, probe_at,
                                                probe_batch)

    out = {}
    for path in paths:
        model, meta = load_probe_classifier(path)
        data = checkpoint_probe(meta, path)
        batches = {size: probe_batch(probe_at(f"{data},val={images}", size, glyph_scale(data)))
                   for size in sorted({size for size, _ in plan})}
        row = out[path] = {}
        for size, passes in plan:
            PASSES["fixed"] = passes
            scored = score_batch(model, *batches[size])
            row[f"{size}px x{passes}"] = [scored["accuracy"], scored["auc"]]
            print(f"{path} {size} px, {passes} passes: {row[f'{size}px x{passes}'][0]:.1f}%, "
                  f"AUC {row[f'{size}px x{passes}'][1]:.3f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--passes-lo", type=int, default=2)
    parser.add_argument("--passes-hi", type=int, default=4)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="weightformer train, looped (its arguments follow)", add_help=False)
    scoring = sub.add_parser("score", help="looped checkpoints at fixed pass counts, 64 and 128 px")
    scoring.add_argument("checkpoints", nargs="+")
    scoring.add_argument("--plan", nargs="+", default=["64:2", "64:3", "64:4", "128:3", "128:4", "128:6", "128:8"],
                         help="SIZE:PASSES pairs")
    scoring.add_argument("--images", type=int, default=2000)
    scoring.add_argument("--json")
    args, rest = parser.parse_known_args(argv)
    if not 1 <= args.passes_lo <= args.passes_hi:
        parser.error(f"need 1 <= --passes-lo <= --passes-hi, got {args.passes_lo}, {args.passes_hi}")
    PASSES.update(lo=args.passes_lo, hi=args.passes_hi)
    loop_blocks()
    if args.command == "train":
        from weightformer.cli import main as weightformer
        return weightformer(["train", *rest])
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    torch.set_num_threads(1)
    plan = [tuple(int(v) for v in item.split(":")) for item in args.plan]
    result = score(args.checkpoints, plan, args.images)
    if args.json:
        record = {"passes_trained": [args.passes_lo, args.passes_hi], "images": args.images, "checkpoints": result}
        write_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
