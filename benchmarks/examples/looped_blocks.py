"""An experiment (no option of the package): WeightFormer's block stack applied several times with shared weights,
so that the number of passes, and with it how far a static 3 × 3 conv carries a token, can grow with the canvas.

    python benchmarks/examples/looped_blocks.py train --data path_link:size=64,scale=2,ends=matched \\
        --model weightformer_long_range_tiny --model-kwargs patch_size=4 embed_dim=64 depth=2 drop_path_rate=0.0 \\
        --seed 0 --output RUN/seed0
    python benchmarks/examples/looped_blocks.py score RUN/seed0/last.pt RUN/seed1/last.pt --json OUT.json
    python benchmarks/examples/looped_blocks.py --propagator 8 --propagator-stride 2 --passes-lo 28 --passes-hi 36 \
        --grad-passes 12 train ...    # then score with the same four options

``train`` is ``weightformer train`` with every WeightFormer's ``forward_features`` looped: each training batch
takes a number of passes drawn from ``--passes-lo``..``--passes-hi`` (2..4) by torch's generator, so the blocks
learn to be applied any number of times (as in Schwarzschild et al., 2021, "Can You Learn an Algorithm?", trained
on small mazes and run longer on large ones). ``score`` evaluates looped checkpoints at fixed pass counts on the
checkpoint's probe drawn at 64 and at 128 px: accuracy and the AUC of the logit margin per (size, passes).

``--propagator WIDTH`` loops a small recurrent cell in place of the blocks: the block stack runs once, and a
convolutional GRU of WIDTH channels (:class:`Propagator`) runs the drawn number of passes on its output, reading
that output at every pass ("recall", as in Bansal et al., 2022, "End-to-end Algorithm Synthesis with Recurrent
Networks"). Its state moves one cell per pass and stays in (-1, 1) whatever the number of passes. Its cells are
the tokens, or with ``--propagator-stride PX`` a finer grid of PX-pixel cells that also reads the image itself.
``--grad-passes K`` differentiates only the last K passes of a training batch (the earlier ones run without a
graph, as the progressive training of that paper), which makes long loops affordable. Pass the same propagator
options to ``score``: the cell is part of the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn

from weightformer.atomic import write_atomic

# training draws lo..hi passes; "fixed" (an int) overrides in eval mode; "grad": the propagator's passes that
# training differentiates (the last ones; 0: all)
PASSES = {"lo": 2, "hi": 4, "fixed": None, "grad": 0}


class Propagator(nn.Module):
    """A convolutional GRU on a grid of cells ``stride`` pixels wide: each pass mixes every channel of (state,
    input) over 3 × 3 cells (depthwise), then a linear map gives the update gate z and the candidate c, and the
    state becomes (1 - z) h + z tanh(c). With ``stride`` below the patch size the grid is finer than the tokens:
    its input is the tokens, repeated over their cells, plus a ``stride``-pixel patch embedding of the image, and the
    final state is max-pooled back to the tokens. The output adds that state, projected to the tokens' width, to
    the tokens."""

    def __init__(self, dim: int, width: int, patch: int, stride: int, in_chans: int):
        super().__init__()
        if patch % stride:
            raise ValueError(f"the propagator's stride must divide the patch size {patch}, got {stride}")
        self.cells = patch // stride  # grid cells per token side
        self.read = nn.Linear(dim, width)
        self.pixels = nn.Conv2d(in_chans, width, stride, stride) if self.cells > 1 else None
        # replicate padding: the cell sees no edge of its own beyond the blocks' view of the canvas
        self.spatial = nn.Conv2d(2 * width, 2 * width, 3, padding=1, groups=2 * width, padding_mode="replicate")
        self.gates = nn.Linear(2 * width, 2 * width)  # applied as a 1 × 1 conv
        self.write = nn.Linear(width, dim)
        nn.init.zeros_(self.write.weight)  # starts as the block stack alone
        nn.init.zeros_(self.write.bias)

    def forward(self, x: torch.Tensor, passes: int, image: torch.Tensor = None) -> torch.Tensor:
        """(B, H, W, C) tokens, (B, C_in, H·p, W·p) image -> (B, H, W, C). In training only the last
        ``PASSES["grad"]`` passes (all, if 0) are differentiated: the earlier ones only bring the state there."""
        recall = self.read(x).permute(0, 3, 1, 2)  # (B, w, H, W); channels first in the loop, no permutes there
        if self.pixels is not None:  # (B, w, H·k, W·k), k cells per token side
            fine = recall.repeat_interleave(self.cells, 2).repeat_interleave(self.cells, 3)
            recall = fine + self.pixels(image)[..., :fine.shape[2], :fine.shape[3]]
        state = torch.zeros_like(recall)
        free = max(passes - PASSES["grad"], 0) if self.training and PASSES["grad"] else 0
        for done in range(passes):
            with torch.set_grad_enabled(done >= free and torch.is_grad_enabled()):
                mixed = self.spatial(torch.cat([state, recall], 1))  # (B, 2w, H', W')
                gate, candidate = nn.functional.conv2d(mixed, self.gates.weight[..., None, None],
                                                       self.gates.bias).chunk(2, 1)
                gate = torch.sigmoid(gate)  # (B, w, H', W') each
                state = (1 - gate) * state + gate * torch.tanh(candidate)
        if self.pixels is not None:  # (B, w, H·k, W·k) -> (B, w, H, W)
            state = nn.functional.max_pool2d(state, self.cells)
        return x + self.write(state.permute(0, 2, 3, 1))


def drawn_passes(training: bool) -> int:
    """The passes of this call: drawn from lo..hi in training, else the fixed count or the middle."""
    if training:
        return int(torch.randint(PASSES["lo"], PASSES["hi"] + 1, ()).item())
    return PASSES["fixed"] or (PASSES["lo"] + PASSES["hi"]) // 2


def loop_blocks(propagator: int = 0, stride: int = 0) -> None:
    """Replace WeightFormer.forward_features by the looped one (this process only); with ``propagator`` > 0,
    every WeightFormer built afterwards carries a :class:`Propagator` of that width, looped after the blocks, on
    cells of ``stride`` pixels (0: one cell per token)."""
    from weightformer.models.weightformer import WeightFormer

    def forward_features(self, image: torch.Tensor) -> torch.Tensor:  # (B, C_in, H_img, W_img) -> (B, H, W, C)
        x = self._embed(image)
        passes = drawn_passes(self.training)
        if propagator:
            x = self.propagator(self.blocks(x), passes, image)
        else:
            for _ in range(passes):
                for block in self.blocks:
                    x = block(x)
        return self.norm(x)

    if propagator:
        build = WeightFormer.__init__

        def __init__(self, *args, **kwargs):
            build(self, *args, **kwargs)
            self.propagator = Propagator(self.embed_dim, propagator, self.patch_size, stride or self.patch_size,
                                         self.in_chans)

        WeightFormer.__init__ = __init__
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
    parser.add_argument("--propagator", type=int, default=0, metavar="WIDTH",
                        help="loop a convolutional GRU of this width after the blocks, not the blocks (0: the blocks)")
    parser.add_argument("--grad-passes", type=int, default=0, metavar="K",
                        help="differentiate only the propagator's last K passes in training (0: all)")
    parser.add_argument("--propagator-stride", type=int, default=0, metavar="PX",
                        help="the GRU's cells in pixels, a divisor of the patch size (0: one cell per token)")
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
    if min(args.propagator, args.propagator_stride, args.grad_passes) < 0:
        parser.error(f"--propagator, --propagator-stride and --grad-passes must be >= 0, got {args.propagator}, "
                     f"{args.propagator_stride}, {args.grad_passes}")
    PASSES.update(lo=args.passes_lo, hi=args.passes_hi, grad=args.grad_passes)
    loop_blocks(args.propagator, args.propagator_stride)
    if args.command == "train":
        from weightformer.cli import main as weightformer
        return weightformer(["train", *rest])
    if rest:
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    torch.set_num_threads(1)
    plan = [tuple(int(v) for v in item.split(":")) for item in args.plan]
    result = score(args.checkpoints, plan, args.images)
    if args.json:
        record = {"passes_trained": [args.passes_lo, args.passes_hi], "propagator": args.propagator,
                  "propagator_stride": args.propagator_stride,
                  "images": args.images, "checkpoints": result}
        write_atomic(args.json, json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
