"""``weightformer analyze erf | updates | interaction | transfer``: a thin command line over :mod:`.erf`,
:mod:`.dynamics`, :mod:`.interaction` and :mod:`.transfer`. Each ``--model`` is ``NAME[:key=value,...]`` (a timm
model with kwargs, ``weightformer_tiny:dynamic_period=0``) or ``ckpt=PATH`` (a ``weightformer train`` checkpoint).
Building the command line imports no torch."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.config import parse_model_kwargs
from ..engine.errors import ConfigError
from ..engine.metrics import json_text
from ..engine.outputs import check_output, move_aside, write_atomic
from .erf import erf_map, erf_stats

if TYPE_CHECKING:  # imported where the tools run: the command line (--help, a bad flag) needs none of them
    import torch
    from torch import nn

__all__ = ["DEFAULT_MODELS", "build_from_spec", "check_models", "check_spec", "erf_report", "load_images", "main", "plot_erf_grid"]

# The comparison of the docs: every WeightFormer predictor (at the released placement), all-static, DeiT.
DEFAULT_MODELS = (
    "weightformer_tiny",
    *(f"weightformer_tiny:linear_predictor={p}" for p in ("gap", "linear", "nonlinear", "deep", "bilateral_unit", "score_pool", "centered")),
    *(f"weightformer_tiny:dwc_predictor={p}" for p in ("gap", "amp_dir", "conv", "score_gap")),
    "weightformer_tiny:dynamic_period=0",
    "deit_tiny_patch16_224",
)


def check_spec(spec: str) -> None:
    """Raise ConfigError unless ``spec`` names a timm model or an existing checkpoint file (before any work)."""
    import timm

    from .. import models  # noqa: F401  (registers the WeightFormer models with timm)

    name = spec.partition(":")[0]
    if name.startswith("ckpt="):
        if not Path(name[len("ckpt="):]).is_file():
            raise ConfigError(f"--model {spec!r}: no such checkpoint file")
    elif not timm.is_model(name):
        raise ConfigError(f"--model {spec!r}: {name!r} is not a timm model; write NAME[:key=value,...] or ckpt=PATH")


def check_models(specs: Sequence[str], in_chans: int, img_size: int) -> None:
    """Before any work: every spec names a model or a file, and each model builds and takes ``img_size`` images
    (built once and dropped), so a bad last model is one line before the first one is analysed."""
    for spec in specs:
        check_spec(spec)
    for spec in specs:
        build_from_spec(spec, in_chans, img_size)


def build_from_spec(spec: str, in_chans: int, img_size: int) -> tuple[nn.Module, dict[str, Any]]:
    """A model from ``NAME[:key=value,...]`` or ``ckpt=PATH`` and what it was built from. One-line ConfigError (or
    CheckpointError) for an unknown model, kwargs it does not take, a checkpoint of another task than
    classification, or a model that cannot take ``img_size`` images."""
    import timm
    import torch

    from .. import models  # noqa: F401  (registers the WeightFormer models with timm)
    from ..classification.model import check_input_size
    from ..engine.weights import load_model

    check_spec(spec)
    name, _, text = spec.partition(":")
    if name.startswith("ckpt="):
        path = name[len("ckpt="):]
        loaded = load_model(path, task="classification")
        model, meta = loaded.model, loaded.meta
        source = {"checkpoint": path, **{k: meta[k] for k in ("model", "model_kwargs", "in_chans")}}
    else:
        kwargs = parse_model_kwargs([item for item in text.split(",") if item], flag=f"--model {name}:")
        cfg = timm.models.get_pretrained_cfg(name)
        if name.startswith("weightformer") or (cfg is not None and cfg.fixed_input_size):  # position embeddings fix it
            kwargs.setdefault("img_size", img_size)
        try:
            model = timm.create_model(name, num_classes=0, in_chans=in_chans, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"--model {spec!r}: cannot build it ({exc})") from exc
        source = {"model": name, "model_kwargs": kwargs, "in_chans": in_chans}
    check_input_size(model, {"model": source["model"], "in_chans": source["in_chans"], "img_size": img_size},
                     next((p.device for p in model.parameters()), torch.device("cpu")))
    return model, source


def load_images(data: str, num: int, img_size: int, in_chans: int, seed: int) -> torch.Tensor:
    """``num`` images (num, C, S, S): standard-normal noise for ``noise``, else the first held-out images of
    a built-in data set (mnist, a probe), normalised and resized to ``img_size``."""
    import torch

    from ..data import BUILTIN_DATASETS
    from .transfer import probe_batch

    if data == "noise":
        return torch.randn(num, in_chans, img_size, img_size, generator=torch.Generator().manual_seed(seed))
    if data not in BUILTIN_DATASETS:
        raise ConfigError(f"--data {data!r}: use noise or a built-in data set (mnist, glyph_match, ...)")
    raw = probe_batch(data)[0][:num]  # (N, 1, H, W)
    raw = torch.nn.functional.interpolate(raw, size=(img_size, img_size), mode="bilinear", align_corners=False)
    return raw.expand(-1, in_chans, -1, -1).contiguous()


def erf_report(specs: Sequence[str], data: str = "noise", num_images: int = 8, img_size: int = 224,
               in_chans: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    """ERF map and numbers of each model spec: ``[{"spec", "source", "stats", "map"}, ...]``."""
    import torch

    from ..progress import progress

    check_models(specs, in_chans, img_size)
    out = []
    for spec in progress(specs, desc="ERF", unit="model"):
        torch.manual_seed(seed)  # the same random init for every run of the same spec
        model, source = build_from_spec(spec, in_chans, img_size)
        images = load_images(data, num_images, img_size, source["in_chans"], seed)
        erf, center = erf_map(model, images)
        out.append({"spec": spec, "source": source, "stats": erf_stats(erf, center).as_dict(), "map": erf})
    return out


def plot_erf_grid(results: list[dict[str, Any]], path: Path, columns: int = 4) -> None:
    """Log-scaled ERF maps side by side, each titled with its spec and share outside the centre."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(results) / columns)
    cols = min(columns, len(results))
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.8 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, result in zip(axes.ravel(), results):
        erf = result["map"]
        ax.imshow(np.log10(erf / erf.max() + 1e-6), cmap="magma", vmin=-6, vmax=0)
        spec = result["spec"]
        if spec.startswith("ckpt="):  # name a run's checkpoint by its folders: <variant>/<seed>/best.pt
            spec = "/".join(Path(spec[len("ckpt="):]).parts[-3:])
        title = spec.replace("weightformer_tiny", "WF-T").replace("deit_tiny_patch16_224", "DeiT-T")
        ax.set_title(f"{title[:34]}\nout {result['stats']['outside_center']:.1%}, "
                     f"r90 {result['stats']['radius_90_rel']:.2f}", fontsize=7)
    fig.suptitle("effective receptive field, log10 of |grad| / max (0 to -6)", fontsize=9)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def _check_outputs(outputs: Sequence[tuple[Path, str]], overwrite: bool, specs: Sequence[str]) -> None:
    """Before the work: each (path, flag) can be written, is none of the ``ckpt=`` inputs among ``specs``, and is
    free unless ``overwrite``."""
    inputs = [spec[len("ckpt="):] for spec in specs if spec.startswith("ckpt=")]
    for path, flag in outputs:
        check_output(path, overwrite, folder=False, flag=flag, inputs=inputs)


def _move_aside(paths: Sequence[Path]) -> None:
    """The one output policy: an earlier file is moved aside, never replaced."""
    for path in paths:
        if os.path.lexists(path):
            move_aside(path)


def _erf_command(args: argparse.Namespace) -> int:
    png, json_path = Path(args.output), Path(args.json or Path(args.output).with_suffix(".json"))
    _check_outputs(((png, "--output"), (json_path, "--json")), args.overwrite, args.model or ())
    results = erf_report(args.model or DEFAULT_MODELS, data=args.data, num_images=args.num_images,
                         img_size=args.img_size, in_chans=args.in_chans, seed=args.seed)
    _move_aside((png, json_path))
    plot_erf_grid(results, png)
    table = [{"spec": r["spec"], "source": r["source"], **r["stats"]} for r in results]
    write_atomic(json_path, json_text({"img_size": args.img_size, "data": args.data, "num_images": args.num_images,
                                        "models": table}, indent=2) + "\n")
    for row in table:
        print(f"{row['spec']:<48} outside centre {row['outside_center']:6.1%}  r50 {row['radius_50']:6.1f} px  "
              f"r90 {row['radius_90']:6.1f} px")
    print(f"wrote {png} and {json_path}")
    return 0


def _per_model_command(args: argparse.Namespace) -> int:
    """``updates`` (a row per dynamic layer) and ``interaction`` (a row per model): rows printed, then as JSON."""
    import torch

    from .dynamics import dynamic_update_stats
    from .interaction import edge_interaction

    check_models(args.model, args.in_chans, args.img_size)
    rows = []
    for spec in args.model:
        torch.manual_seed(args.seed)
        model, source = build_from_spec(spec, args.in_chans, args.img_size)
        if args.tool == "interaction":
            rows.append(row := {"spec": spec, **edge_interaction(model, args.img_size, placements=args.placements,
                                                                 seed=args.seed, glyphs=args.glyphs)})
            print(f"{spec[-60:]:<60} interaction {row['interaction']:.2e}  (cross {row['cross']:.2e}, "
                  f"left effect {row['left_effect']:.2e})")
            continue
        images = load_images(args.data, args.num_images, args.img_size, source["in_chans"], args.seed)
        for row in dynamic_update_stats(model, images):
            rows.append({"spec": spec, **row})
            print(f"{spec[-40:]:<40} {row['layer']:<18} {row['kind']:<6} |Δ| {row['delta_norm']:.2e}  "
                  f"capped {row['capped_norm']:.2e}  static {row['static_norm']:.3f}  spread {row['spread']:.2e}")
    if not rows:
        print("no dynamic layers in these models")
    print(json_text(rows))
    return 0


def _transfer_command(args: argparse.Namespace) -> int:
    from .transfer import diagnose_checkpoint, transfer_table, write_transfer

    paths = []
    for spec in args.model:
        if not spec.startswith("ckpt=") or ":" in spec:
            raise ConfigError(f"--model {spec!r}: transfer evaluates trained probe classifiers; write ckpt=PATH")
        paths.append(spec[len("ckpt="):])
    sizes = sorted(set(args.sizes))
    png = Path(args.output)
    outputs = (png, png.with_suffix(".json"), png.with_suffix(".md"))
    _check_outputs([(path, "--output") for path in outputs], args.overwrite, args.model)
    rows = transfer_table(paths, sizes, data=args.data, val=args.val)
    if args.diagnose:
        for row in rows:
            row["diagnosis"] = diagnose_checkpoint(row["checkpoint"], [s for s in sizes if s > sizes[0]], num=args.diagnose)
    _move_aside(outputs)
    json_path, md_path = write_transfer(rows, sizes, png)
    print(md_path.read_text(), end="")
    print(f"wrote {png}, {json_path} and {md_path}")
    return 0


def _model_flags(parser: argparse.ArgumentParser, required: bool, num_images: int | None, img_size: int,
                 in_chans: int, seed: str) -> None:
    """The flags that say which models to build and what to feed them."""
    parser.add_argument("--model", action="append", required=required, metavar="NAME[:k=v,...]|ckpt=PATH",
                        help="a timm model with kwargs, or a weightformer train checkpoint; repeat for more")
    if num_images is not None:
        parser.add_argument("--data", default="noise", help="noise (default), or a built-in data set's held-out images")
        parser.add_argument("--num-images", type=int, default=num_images, help=f"images (default: {num_images})")
    parser.add_argument("--img-size", type=int, default=img_size, help=f"input side in pixels (default: {img_size})")
    parser.add_argument("--in-chans", type=int, default=in_chans,
                        help=f"input channels of models built by name (default: {in_chans})")
    parser.add_argument("--seed", type=int, default=0, help=f"seed of the random init and {seed} (default: 0)")


def main(argv: Sequence[str] | None = None) -> int:
    """``weightformer analyze erf | updates | interaction | transfer ...``."""
    from ..engine.cli import OneLineParser, run_reporting_errors

    parser = OneLineParser(prog="weightformer analyze", description="Analysis tools.")
    sub = parser.add_subparsers(dest="tool", required=True)
    erf = sub.add_parser("erf", help="effective receptive fields: a PNG grid of heat maps and a JSON of numbers",
                         description="Gradient of the centre token's output w.r.t. the input pixels, averaged over "
                                     "images, for each --model (default: every WeightFormer-T predictor, all-static "
                                     "and DeiT-T at random init).")
    _model_flags(erf, required=False, num_images=8, img_size=224, in_chans=3, seed="the noise images")
    erf.add_argument("--output", default="erf.png", help="PNG grid to write (default: erf.png)")
    erf.add_argument("--json", help="JSON of the numbers (default: the --output path with .json)")
    erf.add_argument("--overwrite", action="store_true",
                     help="move existing output files aside (<name>.previous-<time>) and write anew")
    updates = sub.add_parser("updates", help="size and image-dependence of the predicted ΔW / ΔK of dynamic layers",
                             description="For each dynamic layer: mean column norm of the raw and capped update, "
                                         "of the static weight, and the update's spread across images.")
    _model_flags(updates, required=True, num_images=32, img_size=224, in_chans=3, seed="noise")
    inter = sub.add_parser("interaction", help="do glyphs at opposite edges interact in the pooled features?",
                           description="The cross term φ(AA) − φ(AB) − φ(BA) + φ(BB) of the pooled features over "
                                       "left/right glyph swaps, relative to the left glyph's own effect: 0 for a "
                                       "model that only sums local features (see weightformer.analysis.interaction).")
    _model_flags(inter, required=True, num_images=None, img_size=48, in_chans=1, seed="placements")
    inter.add_argument("--placements", type=int, default=16, help="random glyph placements (default: 16)")
    inter.add_argument("--glyphs", type=int, default=2, help="glyphs to draw pairs from, 2-10 (default: 2)")
    transfer = sub.add_parser("transfer", help="probe checkpoints on larger canvases with the same glyphs (no fine-tuning)",
                              description="Held-out accuracy of each probe checkpoint at each --sizes canvas, the glyphs "
                                          "drawn at the scale the checkpoint was trained with (the probe's scale option), "
                                          "so the relation spans more tokens. Writes a PNG plot and a JSON and Markdown table "
                                          "beside it. A ViT's position embedding is resampled as timm does it.")
    transfer.add_argument("--model", action="extend", nargs="+", required=True, metavar="ckpt=PATH",
                          help="weightformer train checkpoints of a probe (ckpt=A ckpt=B ...; repeatable)")
    transfer.add_argument("--data", help="the probe to draw, with options (default: each checkpoint's own)")
    transfer.add_argument("--sizes", type=int, nargs="+", default=[64, 96, 128], help="canvas sides in px (default: 64 96 128)")
    transfer.add_argument("--val", type=int, help="held-out images per size (default: the probe's)")
    transfer.add_argument("--diagnose", type=int, default=0, metavar="N",
                          help="also compare N held-out images with the same images with background inserted, layer by "
                               "layer and with one component swapped at a time (weightformer.analysis.transfer), into the JSON")
    transfer.add_argument("--output", default="transfer.png", help="plot to write; .json and .md beside it (default: transfer.png)")
    transfer.add_argument("--overwrite", action="store_true", help="move existing output files aside and write anew")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.tool == "transfer" and (min(args.sizes) < 32 or (args.val is not None and args.val < 1) or args.diagnose < 0):
        parser.error("--sizes must be at least 32 px, --val at least 1 and --diagnose at least 0")
    if args.tool == "interaction" and not (2 <= args.glyphs <= 10 and args.img_size >= 32 and args.placements >= 1):
        parser.error("--glyphs must be 2-10, --img-size at least 32 and --placements at least 1")
    command = {"erf": _erf_command, "updates": _per_model_command, "interaction": _per_model_command,
               "transfer": _transfer_command}[args.tool]

    def checked() -> int:
        for flag in ("num_images", "img_size", "in_chans"):  # the counts and sizes of every tool, before any model
            value = getattr(args, flag, None)
            if value is not None and value < 1:
                raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
        return command(args)

    return run_reporting_errors(checked)
