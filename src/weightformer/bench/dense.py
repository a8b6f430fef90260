"""``weightformer bench dense``: what a backbone costs at detection and segmentation sizes.

For each backbone, behind ViTDet's simple feature pyramid (256 channels, as in Mask R-CNN), at each
input size: GMACs and parameters of the trunk alone and with the pyramid, peak memory and img/s of a
forward pass and of a training step (forward and backward of the trunk and pyramid).

The backbones are WeightFormer-T/S and DeiT-T/S, DeiT both with global attention in every block and
in ViTDet's form (Li et al., arXiv 2203.16527: 14×14 window attention with relative positions, global
attention only in blocks 3, 6, 9 and 12). ViTDet needs those windows to afford 1024²; WeightFormer's
dynamic blocks are global at linear cost, so it needs none.

Conventions:
- **MACs**, counted by torch's ``FlopCounterMode`` (FLOPs / 2), with every attention module switched
  to its explicit matmuls while counting so the counter sees them. Detection papers, this one
  included, report fvcore's MAC counts as "FLOPs". Norms, activations and softmax are not counted.
- Sizes are given as H×W. An 800×1333 image is padded to 800×1344 by the pyramid (sides to a multiple
  of 32, as torchvision's detector transform does), and that is what is measured.
- Peak memory: on CUDA the allocator's peak over one call; on CPU the peak RSS of one call in a fresh
  subprocess (see :mod:`weightformer.bench.memory`), minus the RSS before it.
- Time: the models are timed round-robin at each size (one call per model per round), medians over the
  rounds, batch 1. A call predicted to take longer than ``--max-call-seconds`` is skipped and marked.

The parser needs no torch (``--help`` and a bad flag answer at once); the measurements import it.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from .machine import describe
from .options import (DEVICE_HELP, add_overwrite_argument, check_device, check_number, number, one_line_error,
                      strings)

if TYPE_CHECKING:
    from torch import nn

__all__ = ["BACKBONES", "DenseBenchConfig", "build_dense_model", "count_macs", "explicit_attention", "gmacs", "main",
           "markdown_table", "run"]

PYRAMID_CHANNELS = 256  # Mask R-CNN's FPN width, as in ViTDet and the paper
INFER, TRAIN = "infer", "train"
OUTPUT_NAMES = ("results.json", "results.md")


@dataclass(frozen=True)
class Backbone:
    """A compared backbone: its label, timm name and keyword arguments."""

    label: str
    timm_name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def _vitdet(dim: int, heads: int) -> dict[str, Any]:
    """ViTDet's windowed plain ViT (timm's SAM encoder without its neck): 12 blocks, 14×14 windows,
    relative positions, global attention in blocks 3, 6, 9 and 12."""
    return dict(embed_dim=dim, depth=12, num_heads=heads, window_size=14, global_attn_indexes=(2, 5, 8, 11),
                use_rel_pos=True, neck_chans=0, img_size=1024)


BACKBONES: dict[str, Backbone] = {
    "wf-t": Backbone("WeightFormer-T", "weightformer_tiny"),
    "deit-t": Backbone("DeiT-T (global)", "deit_tiny_patch16_224"),
    "deit-t-win": Backbone("DeiT-T (ViTDet windows)", "samvit_base_patch16", _vitdet(192, 3)),
    "wf-s": Backbone("WeightFormer-S", "weightformer_small"),
    "deit-s": Backbone("DeiT-S (global)", "deit_small_patch16_224"),
    "deit-s-win": Backbone("DeiT-S (ViTDet windows)", "samvit_base_patch16", _vitdet(384, 6)),
}
DEFAULT_SIZES = ((800, 1333), (1024, 1024), (512, 512))


@dataclass
class DenseBenchConfig:
    """What ``weightformer bench dense`` measures."""

    models: Sequence[str] = tuple(BACKBONES)
    sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES
    modes: Sequence[str] = (INFER, TRAIN)
    repetitions: int = 3
    max_call_seconds: float = 60.0
    device: str = "cpu"
    memory: bool = True

    def __post_init__(self) -> None:
        """Every setting checked on creation, as the flags are: a ValueError (ConfigError) naming it."""
        from ..engine.errors import ConfigError

        unknown = [m for m in self.models if m not in BACKBONES]
        if unknown or not self.models:
            raise ConfigError(f"unknown or no models {unknown}; choose from {', '.join(BACKBONES)}")
        if not self.sizes or any(len(s) != 2 or min(s) < 32 for s in self.sizes):
            raise ConfigError(f"sizes are (height, width) pairs of at least 32 px, got {list(self.sizes)}")
        if not self.modes or any(m not in (INFER, TRAIN) for m in self.modes):
            raise ConfigError(f"modes are infer and/or train, got {list(self.modes)}")
        check_number("repetitions", self.repetitions, 1)
        check_number("max_call_seconds", self.max_call_seconds, 0, inclusive=False)
        self.device = check_device(self.device)


def build_dense_model(key: str) -> nn.Module:
    """The backbone ``key`` behind a 256-channel simple feature pyramid, randomly initialised."""
    import timm

    from ..models.pyramid import SimpleFeaturePyramid, build_backbone

    spec = BACKBONES[key]
    if spec.timm_name.startswith("samvit"):  # no pretrained config to consult; num_classes=0 drops the head
        backbone = timm.create_model(spec.timm_name, num_classes=0, **spec.kwargs)
    else:
        backbone = build_backbone(spec.timm_name, **spec.kwargs)
    return SimpleFeaturePyramid(backbone, out_channels=PYRAMID_CHANNELS)


def gmacs(fn: Callable[[], Any]) -> float:
    """GMACs of one call of ``fn``, in inference mode, as torch's FlopCounterMode counts them (run it
    under :func:`explicit_attention` so that fused attention is counted too)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.inference_mode(), counter:
        fn()
    return counter.get_total_flops() / 2e9


@contextmanager
def explicit_attention(model: nn.Module) -> Iterator[None]:
    """``model``'s fused attention modules (timm's ``fused_attn``) computing explicit QKᵀ and AV, which the
    counter sees, inside the block; their setting is restored after it."""
    fused = {m: m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")}
    for module in fused:
        module.fused_attn = False
    try:
        yield
    finally:
        for module, value in fused.items():
            module.fused_attn = value


def count_macs(model: nn.Module, height: int, width: int) -> dict[str, float]:
    """GMACs per image of the trunk (``model.backbone``, on the padded image the pyramid gives it) and
    of the trunk with the pyramid."""
    import torch

    padded = torch.zeros(1, 3, math.ceil(height / 32) * 32, math.ceil(width / 32) * 32)
    with explicit_attention(model):
        trunk = gmacs(lambda: model.backbone.forward_features(padded))
        total = gmacs(lambda: model(torch.zeros(1, 3, height, width)))
    return {"trunk_gmacs": trunk, "total_gmacs": total}


def _call(model: nn.Module, mode: str, height: int, width: int, device: str) -> Callable[[], None]:
    import torch

    images = torch.randn(1, 3, height, width, device=device)
    if mode == INFER:
        def infer() -> None:
            with torch.inference_mode():
                model(images)
        return infer

    def step() -> None:
        features = model(images)
        sum(f.float().mean() for f in features.values()).backward()
        model.zero_grad(set_to_none=True)
    return step


def _peak_memory_here(key: str, mode: str, height: int, width: int, device: str) -> float:
    """MiB that one call adds on top of what the built model holds (this process)."""
    import torch

    from .memory import MIB, _proc_status_kib, _reset_peak_rss, cuda_peak

    model = build_dense_model(key).to(device).train(mode == TRAIN)
    call = _call(model, mode, height, width, device)
    _call(model, mode, 64, 64, device)()  # warm-up: lazy allocations and kernels
    if torch.device(device).type == "cuda":
        baseline, peak = cuda_peak(call, device)
        return (peak - baseline) / MIB
    gc.collect()
    baseline = _proc_status_kib("VmRSS")
    if not _reset_peak_rss():
        raise RuntimeError("this kernel cannot reset the peak RSS (/proc/self/clear_refs); use --no-memory")
    call()
    return (_proc_status_kib("VmHWM") - baseline) / 1024


def peak_memory(key: str, mode: str, height: int, width: int, device: str) -> Optional[float]:
    """Peak MiB of one call: in this process on CUDA, in a fresh subprocess on CPU; None when the
    subprocess was killed (most likely out of memory)."""
    import torch

    if torch.device(device).type == "cuda":
        return _peak_memory_here(key, mode, height, width, device)
    spec = json.dumps({"key": key, "mode": mode, "height": height, "width": width, "threads": torch.get_num_threads()})
    proc = subprocess.run([sys.executable, "-m", "weightformer.bench.dense", "--memory-worker", spec],
                          capture_output=True, text=True)
    if proc.returncode < 0:
        return None
    if proc.returncode != 0:
        raise RuntimeError(f"the memory worker for {spec} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return float(proc.stdout.strip().splitlines()[-1])


def _time_size(models: dict[str, nn.Module], mode: str, height: int, width: int, config: DenseBenchConfig,
               log: Callable[[str], None]) -> dict[str, Optional[float]]:
    """Seconds per image of each model, round-robin, medians; None where a call would take too long."""
    from .timing import median, time_call

    calls, first = {}, {}
    for key, model in models.items():
        model.train(mode == TRAIN)
        call = _call(model, mode, height, width, config.device)
        _call(model, mode, 64, 64, config.device)()  # warm-up at a small size
        first[key] = time_call(call, config.device)
        if first[key] <= config.max_call_seconds:
            calls[key] = call
        else:
            log(f"  {key} {mode} {height}x{width}: {first[key]:.1f} s per call, over --max-call-seconds; skipped")
    samples: dict[str, list[float]] = {key: [] for key in calls}
    for _ in range(config.repetitions):
        for key, call in calls.items():
            samples[key].append(time_call(call, config.device))
    return {key: median(samples[key]) if key in samples else None for key in models}


def run(config: DenseBenchConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every model at every size; returns the result document (rows plus machine and settings)."""
    from .machine import machine_info

    machine = machine_info(config.device)  # at the start: the load average the measurements began under
    start = time.perf_counter()
    models = {key: build_dense_model(key).to(config.device) for key in config.models}
    rows = []
    for height, width in config.sizes:
        log(f"{height}x{width}: counting MACs")
        costs = {key: count_macs(model, height, width) for key, model in models.items()}
        seconds = {}
        for mode in config.modes:
            log(f"{height}x{width}: timing {mode} ({config.repetitions} rounds)")
            seconds[mode] = _time_size(models, mode, height, width, config, log)
        for key, model in models.items():
            row: dict[str, Any] = {
                "model": key, "label": BACKBONES[key].label, "height": height, "width": width,
                "padded": [math.ceil(height / 32) * 32, math.ceil(width / 32) * 32],
                "trunk_params_m": sum(p.numel() for p in model.backbone.parameters()) / 1e6,
                "total_params_m": sum(p.numel() for p in model.parameters()) / 1e6, **costs[key],
            }
            for mode in config.modes:
                s = seconds[mode][key]
                row[f"{mode}_img_per_s"] = None if s is None else 1.0 / s
                if config.memory and s is not None:
                    log(f"  {key} {mode} {height}x{width}: peak memory")
                    row[f"{mode}_peak_mib"] = peak_memory(key, mode, height, width, config.device)
            rows.append(row)
    return {"machine": machine, "settings": {**config.__dict__, "sizes": [list(s) for s in config.sizes]},
            "rows": rows, "elapsed_s": time.perf_counter() - start}


def _number(value: Optional[float], digits: int) -> str:
    return "skipped" if value is None else f"{value:.{digits}f}"


def markdown_table(result: dict[str, Any]) -> str:
    """One table per size, with each column's ratio to the first model of the table."""
    lines = [f"Backbone + 256-channel simple feature pyramid, batch 1, {describe(result['machine'])}.", ""]
    if result["machine"].get("command"):
        lines += [f"Command: `{result['machine']['command']}`.", ""]
    modes = result["settings"]["modes"]
    for height, width in result["settings"]["sizes"]:
        rows = [r for r in result["rows"] if (r["height"], r["width"]) == (height, width)]
        padded = rows[0]["padded"]
        lines += [f"### {height}×{width}" + (f" (padded to {padded[0]}×{padded[1]})" if padded != [height, width] else ""),
                  ""]
        header = ["backbone", "trunk GMACs", "+ pyramid GMACs", "trunk params (M)", "+ pyramid params (M)"]
        for mode in modes:
            header += [f"{mode} img/s", f"{mode} peak MiB"]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for r in rows:
            cells = [r["label"], f"{r['trunk_gmacs']:.1f}", f"{r['total_gmacs']:.1f}", f"{r['trunk_params_m']:.2f}",
                     f"{r['total_params_m']:.2f}"]
            for mode in modes:
                cells += [_number(r.get(f"{mode}_img_per_s"), 3), _number(r.get(f"{mode}_peak_mib"), 0)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _size(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 32:
        raise argparse.ArgumentTypeError(f"a size is S or HxW in pixels, at least 32 (e.g. 1024 or 800x1333), got {text!r}")
    return (values[0], values[-1])


def _list(kind: Callable[[str], Any], what: str) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        values = [kind(part) for part in strings(text)]
        if not values:
            raise argparse.ArgumentTypeError(f"no {what} given in {text!r}")
        return values
    return parse


def _model(text: str) -> str:
    if text not in BACKBONES:
        raise argparse.ArgumentTypeError(f"unknown model {text!r}; choose from {', '.join(BACKBONES)}")
    return text


def _mode(text: str) -> str:
    if text not in (INFER, TRAIN):
        raise argparse.ArgumentTypeError(f"unknown mode {text!r}; choose infer, train or both")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The options of ``weightformer bench dense``; a bad one is one ``error:`` line and exit status 2."""
    parser = argparse.ArgumentParser(prog="weightformer bench dense", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.error = one_line_error(parser)  # type: ignore[method-assign]
    add = parser.add_argument
    add("--models", type=_list(_model, "models"), default=list(BACKBONES),
        help=f"comma-separated (default: {','.join(BACKBONES)})")
    add("--sizes", type=_list(_size, "sizes"), default=list(DEFAULT_SIZES),
        help="comma-separated S or HxW (default: 800x1333,1024,512)")
    add("--modes", type=_list(_mode, "modes"), default=[INFER, TRAIN],
        help="infer, train or both (default: infer,train)")
    add("--repetitions", type=number(1, integer=True), default=3,
        help="timed rounds; medians are reported (default: 3)")
    add("--max-call-seconds", type=number(0, inclusive=False), default=60.0,
        help="skip a model whose first call takes longer (default: 60)")
    add("--no-memory", action="store_true", help="skip the peak-memory measurements")
    add("--device", default="auto", help=DEVICE_HELP)
    add("--out", type=Path, default=None,
        help=f"output folder (default: benchmarks/results/<device type>/dense); one that already holds "
             f"{' or '.join(OUTPUT_NAMES)} is refused unless --overwrite")
    add_overwrite_argument(parser, " and ".join(OUTPUT_NAMES))
    add("--memory-worker", help=argparse.SUPPRESS)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``weightformer bench dense``; returns the exit status. The device and the output
    folder are checked before any measurement (the rule of every bench command:
    :func:`~weightformer.bench.report.claim_out_dir`)."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.memory_worker:  # one call in this fresh process: print its peak MiB
        import torch

        spec = json.loads(args.memory_worker)
        torch.set_num_threads(spec["threads"])
        print(_peak_memory_here(spec["key"], spec["mode"], spec["height"], spec["width"], "cpu"))
        return 0

    from ..engine.cli import run_reporting_errors

    def bench() -> int:
        from ..engine.outputs import removed_if_failed
        from .report import claim_out_dir, write_atomic

        config = DenseBenchConfig(models=args.models, sizes=args.sizes, modes=args.modes, repetitions=args.repetitions,
                                  max_call_seconds=args.max_call_seconds, device=args.device,
                                  memory=not args.no_memory)  # checks the device (one line for cuda without a GPU)
        out = args.out or Path("benchmarks/results") / config.device.split(":")[0] / "dense"
        with removed_if_failed(out):
            claim_out_dir(out, OUTPUT_NAMES, args.overwrite, "weightformer bench dense",
                          log=lambda message: print(message, flush=True))
            result = run(config, log=lambda message: print(message, flush=True))
            table = markdown_table(result)
            print(table, flush=True)
            write_atomic(out / "results.json", (json.dumps(result, indent=2) + "\n").encode())
            write_atomic(out / "results.md", (table + "\n").encode())
        print(f"wrote {out / 'results.json'} and {out / 'results.md'} in {result['elapsed_s']:.0f} s")
        return 0

    return run_reporting_errors(bench)


if __name__ == "__main__":
    sys.exit(main())
