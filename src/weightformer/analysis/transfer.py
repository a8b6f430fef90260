"""Resolution transfer of probe classifiers (``weightformer analyze transfer``): a checkpoint trained on a probe at
one canvas size, evaluated without fine-tuning on larger canvases that draw the same glyphs (the probe's ``scale``
fixed), and :func:`swap_diagnosis` of why accuracy falls. Torch is imported where the functions run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.errors import ConfigError
from ..engine.metrics import FiniteOutputs, json_text
from ..engine.outputs import write_atomic

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["LAYOUTS", "checkpoint_probe", "diagnose_checkpoint", "glyph_scale", "insert_background", "load_probe_classifier", "plot_transfer",
           "probe_at", "probe_batch", "swap_diagnosis", "transfer_markdown", "transfer_table", "write_transfer"]

LAYOUTS = ("between", "around")


def glyph_scale(data: str) -> int | tuple[int, int]:
    """The glyph cell (stroke width) in pixels of a probe data name: its ``scale`` option (a range (lo, hi) for
    ``scale=LO-HI``), or the one its size implies."""
    from ..data.builtin import probe_spec
    from ..data.probes import default_scale

    options = probe_spec(data).options
    return options.get("scale", default_scale(options["size"]))


def _with_options(name: str, **options: Any) -> str:
    """A data name with ``options`` set, after its others: ``_with_options("p:a=1,val=9", val=5) == "p:a=1,val=5"``."""
    kept = [item for item in name.partition(":")[2].split(",") if item and item.partition("=")[0] not in options]
    return f"{name.partition(':')[0]}:{','.join([*kept, *(f'{k}={v}' for k, v in options.items())])}"


def probe_at(data: str, size: int, scale: int | tuple[int, int]) -> str:
    """``data`` (a probe name with options) redrawn at ``size`` px with glyph cell ``scale`` (or range (lo, hi)),
    other options kept: ``probe_at("glyph_match:glyphs=2", 128, 2) == "glyph_match:glyphs=2,size=128,scale=2"``.
    DataError (one line) when the probe cannot draw there."""
    from ..data.builtin import probe_spec

    name = _with_options(data, size=size, scale=f"{scale[0]}-{scale[1]}" if isinstance(scale, tuple) else scale)
    probe_spec(name)  # validates, naming what cannot be drawn
    return name


def checkpoint_probe(meta: dict[str, Any], path: str) -> str:
    """The probe a classifier checkpoint was trained on (its ``data``), or ConfigError if it names none."""
    from ..data.probes import PROBES

    data = str(meta.get("data") or "")
    if data.partition(":")[0] not in PROBES:
        raise ConfigError(f"--model ckpt={path}: not a probe classifier (trained on {data or 'unknown data'!r}, "
                          f"not one of {', '.join(sorted(PROBES))}); pass a checkpoint of weightformer train --data PROBE")
    return data


def load_probe_classifier(path: str) -> tuple[nn.Module, dict[str, Any]]:
    """A ``weightformer train`` classifier checkpoint trained on a probe: (model in eval mode, meta)."""
    from ..engine.weights import load_model

    if not Path(path).is_file():
        raise ConfigError(f"--model ckpt={path}: no such checkpoint file")
    loaded = load_model(path, task="classification")
    checkpoint_probe(loaded.meta, path)
    return loaded.model, loaded.meta


def _fit_grid(model: nn.Module, size: int) -> None:
    """Let ``model`` take ``size`` px images: a ViT's position embedding resampled to the new grid (timm's
    ``set_input_size``, bicubic); a model without position embeddings is left as it is."""
    if getattr(model, "pos_embed", None) is not None and hasattr(model, "set_input_size"):
        model.set_input_size(img_size=size)


def probe_batch(data: str, split: str = "val") -> tuple[torch.Tensor, torch.Tensor]:
    """A built-in data set's split as a classifier sees it: images (N, 1, S, S) normalised with its mean and std, labels (N,)."""
    import torch

    from ..data import open_dataset

    info, splits = open_dataset(data, splits=(split,))
    images = torch.from_numpy(splits[split].images).float().div(255)[:, None]  # (N, 1, S, S)
    return (images - info.mean[0]) / info.std[0], torch.from_numpy(splits[split].labels)


def _accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 200) -> float:
    import torch

    finite, hits = FiniteOutputs("logits", images.device), 0
    with torch.no_grad():
        for i in range(0, len(images), batch):
            logits = model(images[i:i + batch])
            finite.update(logits)
            hits += int((logits.argmax(-1) == labels[i:i + batch]).sum())
    finite.check()  # no accuracy from logits that are not numbers
    return 100.0 * hits / len(images)


def transfer_table(paths: Sequence[str], sizes: Sequence[int], data: str | None = None,
                   val: int | None = None) -> list[dict[str, Any]]:
    """Held-out top-1 (%) of each probe checkpoint at each canvas size, the glyphs drawn at the scale the
    checkpoint was trained with. ``data``: the probe (with options) to draw, default each checkpoint's own;
    ``val``: held-out images per size. Files, probes and sizes are all checked before the first evaluation."""
    from ..classification.evaluate import check_data_fits
    from ..data import builtin_info

    plans = []
    for path in paths:
        _, meta = load_probe_classifier(path)
        trained = checkpoint_probe(meta, path)
        drawn = data or trained
        if val is not None:
            drawn = _with_options(drawn, val=val)
        scale = glyph_scale(trained)
        canvases = [(size, probe_at(drawn, size, scale)) for size in sizes]
        for _, name in canvases:  # the classes eval would refuse
            check_data_fits(meta, builtin_info(name), path)
        plans.append((path, meta, trained, canvases))
    rows = []
    for path, meta, trained, canvases in plans:
        accuracies = {}
        for size, name in canvases:
            model, _ = load_probe_classifier(path)  # afresh, so a resampled position embedding starts from the trained one
            _fit_grid(model, size)
            accuracies[str(size)] = _accuracy(model, *probe_batch(name))
        rows.append({"checkpoint": path, "model": meta["model"], "model_kwargs": meta.get("model_kwargs", {}),
                     "trained_on": trained, "trained_size": meta.get("img_size"), "drawn": [n for _, n in canvases],
                     "accuracy": accuracies})
    return rows


def _label(row: dict[str, Any]) -> str:
    """A row's name: the run folder of its checkpoint (``<run>/best.pt``)."""
    return "/".join(Path(row["checkpoint"]).parts[-2:])


def transfer_markdown(rows: list[dict[str, Any]], sizes: Sequence[int]) -> str:
    head = ("| checkpoint | model | model kwargs | trained on | " + " | ".join(f"{s} px" for s in sizes)
            + f" | {sizes[-1]} / {sizes[0]} |")
    lines = [head, "|" + "---|" * (5 + len(sizes))]
    for row in rows:
        acc = [row["accuracy"][str(s)] for s in sizes]
        kwargs = " ".join(f"{k}={v}" for k, v in row["model_kwargs"].items())
        lines.append(f"| {_label(row)} | {row['model']} | {kwargs} | {row['trained_on']} | "
                     + " | ".join(f"{a:.1f}" for a in acc) + f" | {acc[-1] / acc[0]:.2f} |")
    return "\n".join(lines) + "\n"


def plot_transfer(rows: list[dict[str, Any]], sizes: Sequence[int], path: Path) -> None:
    """Accuracy against canvas size, one line per checkpoint, chance as a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for row in rows:
        ax.plot(sizes, [row["accuracy"][str(s)] for s in sizes], marker="o", label=_label(row))
    ax.axhline(50.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(list(sizes))
    ax.set_xlabel("canvas (px), same glyphs")
    ax.set_ylabel("held-out top-1 (%)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    write_atomic(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def write_transfer(rows: list[dict[str, Any]], sizes: Sequence[int], png: Path) -> tuple[Path, Path]:
    """The plot ``png`` and the table as ``<png stem>.json`` and ``.md`` beside it; returns the two table paths."""
    json_path, md_path = png.with_suffix(".json"), png.with_suffix(".md")
    plot_transfer(rows, sizes, png)
    write_atomic(json_path, json_text({"sizes": list(sizes), "rows": rows}, indent=2) + "\n")
    write_atomic(md_path, transfer_markdown(rows, sizes))
    return json_path, md_path


def insert_background(images: torch.Tensor, size: int, layout: str, background: float) -> torch.Tensor:
    """The same glyphs on a ``size`` px canvas, (B, C, S, S) -> (B, C, size, size), filled with ``background``:

    - ``between``: background columns inserted at the middle column and rows added half above, half
      below, so each glyph keeps its distance to its side edge and the two move apart;
    - ``around``: the image centred on the canvas, the glyphs as far apart as before, far from the edges.
    """
    S = images.shape[-1]
    if layout not in LAYOUTS or size < S:
        raise ValueError(f"layout must be one of {LAYOUTS} and size at least {S}, got {layout!r}, {size}")
    out = images.new_full((*images.shape[:2], size, size), background)
    top = (size - S) // 2
    if layout == "around":
        out[..., top:top + S, top:top + S] = images
    else:
        half = S // 2
        out[..., top:top + S, :half] = images[..., :half]
        out[..., top:top + S, size - (S - half):] = images[..., half:]
    return out


def _forward_parts(model: nn.Module, images: torch.Tensor, replace: dict[str, Any] | None = None
                   ) -> tuple[dict[str, Any], torch.Tensor]:
    """The predicted update of every dynamic layer (by layer name, in forward order), the head's pooled feature
    (``pool``) and the logits; the outputs named in ``replace`` are swapped for the given ones."""
    import torch

    from ..layers.dynamic_layer import DynamicWeightLayer

    modules = {name: m.predictor for name, m in model.named_modules() if isinstance(m, DynamicWeightLayer)}
    modules["pool"] = model.head_drop if hasattr(model, "head_drop") else model.get_classifier()
    store: dict[str, Any] = {}

    def hook(name: str) -> Any:
        def record(_, __, output):
            store[name] = output
            return (replace or {}).get(name)  # None keeps the module's own output
        return record

    handles = [module.register_forward_hook(hook(name)) for name, module in modules.items()]
    try:
        with torch.no_grad():
            logits = model(images)
    finally:
        for handle in handles:
            handle.remove()
    finite = FiniteOutputs("logits", logits.device)
    finite.update(logits)
    finite.check()
    return store, logits


def _relative_change(small: torch.Tensor, large: torch.Tensor) -> float:
    """Median over the batch of ‖large − small‖ / ‖small‖ per sample."""
    small, large = small.flatten(1), large.flatten(1)  # (B, everything else)
    return float(((large - small).norm(dim=1) / small.norm(dim=1).clamp_min(1e-30)).median())


def swap_diagnosis(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, size: int, layout: str,
                   background: float) -> dict[str, Any]:
    """Compare ``images`` (B, C, S, S) with the same glyphs on a ``size`` px canvas (:func:`insert_background`).

    Returns per component (each dynamic layer's update, ``pool`` the head's pooled feature, ``logits``):
    ``change`` = median ‖large − small‖/‖small‖ and ``dependent_change`` for the image-dependent part
    (batch mean removed); and ``accuracy``: at the small size, at the large one, and at the large one with
    one component (or group: ``all linear``, ``all dwc``, ``all dynamic``) replaced by the small image's.
    """
    from ..layers.dynamic_linear import DynamicLinear

    large = insert_background(images, size, layout, background)
    small_parts, small_logits = _forward_parts(model, images)
    large_parts, large_logits = _forward_parts(model, large)
    names = [name for name in small_parts if name != "pool"]
    linear = [n for n, m in model.named_modules() if isinstance(m, DynamicLinear)]
    pairs = {name: (small_parts[name], large_parts[name]) for name in [*names, "pool"]}
    pairs["logits"] = (small_logits, large_logits)
    changes = {name: {"change": _relative_change(s, l), "dependent_change": _relative_change(
        s - s.mean(dim=0, keepdim=True), l - l.mean(dim=0, keepdim=True))} for name, (s, l) in pairs.items()}

    def accuracy(logits: torch.Tensor) -> float:
        return 100.0 * float((logits.argmax(-1) == labels).float().mean())

    groups: dict[str, list[str]] = {name: [name] for name in [*names, "pool"]}
    groups.update({"all linear": [n for n in names if n in linear], "all dwc": [n for n in names if n not in linear],
                   "all dynamic": names, "all dynamic + pool": [*names, "pool"]})
    swapped = {group: accuracy(_forward_parts(model, large, {name: small_parts[name] for name in members})[1])
               for group, members in groups.items() if members}
    return {"size": size, "layout": layout, "small_size": images.shape[-1], "images": len(images),
            "accuracy": {"small": accuracy(small_logits), "large": accuracy(large_logits), "large, swapped in": swapped},
            "changes": changes}


def diagnose_checkpoint(path: str, sizes: Sequence[int], layouts: Sequence[str] = LAYOUTS, num: int = 500
                        ) -> list[dict[str, Any]]:
    """:func:`swap_diagnosis` of a probe checkpoint on ``num`` of its own held-out images, per size and layout."""
    from ..data.builtin import probe_spec

    model, meta = load_probe_classifier(path)
    data = checkpoint_probe(meta, path)
    images, labels = probe_batch(data)
    spec = probe_spec(data)
    background = (0.0 - spec.mean[0]) / spec.std[0]  # a blank pixel, normalised
    return [{"checkpoint": path, **swap_diagnosis(model, images[:num], labels[:num], size, layout, background)}
            for size in sizes for layout in layouts]
