"""``weightformer bench dense``: each dense subject (WeightFormer-T/S, DeiT-T/S global and ViTDet-windowed) behind
ViTDet's 256-channel simple feature pyramid at each H×W size (padded to multiples of 32, as measured): GMACs
(torch's FlopCounterMode / 2, attention included) and parameters of the trunk and with the pyramid, extra
peak memory and img/s (batch 1, medians) of a forward and of a training step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from .checks import MODES, check_choices, check_device, check_number
from .subjects import INFER, TRAIN, padded, prepare, suite

FILES = ("results.json", "results.md")
DEFAULT_SIZES = ((800, 1333), (1024, 1024), (512, 512))


@dataclass
class DenseBenchConfig:
    """What ``weightformer bench dense`` measures, checked on creation as the flags are."""

    models: Sequence[str] = tuple(suite("dense"))
    sizes: Sequence[tuple[int, int]] = DEFAULT_SIZES
    modes: Sequence[str] = (INFER, TRAIN)
    repetitions: int = 3
    max_call_seconds: float = 60.0
    device: str = "cpu"
    memory: bool = True

    def __post_init__(self) -> None:
        from ..engine.errors import ConfigError

        check_choices("model", self.models, list(suite("dense")))
        if not self.sizes or any(len(s) != 2 or min(s) < 32 for s in self.sizes):
            raise ConfigError(f"sizes are (height, width) pairs of at least 32 px, got {list(self.sizes)}")
        check_choices("mode", self.modes, MODES)
        check_number("repetitions", self.repetitions, 1)
        check_number("max_call_seconds", self.max_call_seconds, 0, inclusive=False)
        self.device = check_device(self.device)


def count_macs(model: Any, height: int, width: int) -> dict[str, float]:
    """GMACs per image of the trunk (on the padded image the pyramid gives it) and of the trunk with the pyramid."""
    import torch

    from .flops import count_flops

    trunk = count_flops(model.backbone.forward_features, torch.zeros(1, 3, *padded(height, width)), modules=model)
    total = count_flops(model, torch.zeros(1, 3, height, width))
    return {"trunk_gmacs": trunk.macs / 1e9, "total_gmacs": total.macs / 1e9}


def run(config: DenseBenchConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    from . import memory
    from .results import machine_info
    from .subjects import param_count
    from .timing import median, side_by_side, time_call

    machine = machine_info(config.device)  # at the start: the load average the measurements began under
    start = time.perf_counter()
    subjects = suite("dense")
    models = {key: subjects[key].build(None, config.device) for key in config.models}
    rows = []
    for height, width in config.sizes:
        log(f"{height}x{width}: counting MACs")
        costs = {key: count_macs(model, height, width) for key, model in models.items()}
        seconds: dict[str, dict[str, Optional[float]]] = {}
        for mode in config.modes:
            log(f"{height}x{width}: timing {mode} ({config.repetitions} rounds)")
            calls = {}
            for key, model in models.items():
                prepare(subjects[key], mode, (64, 64), 1, config.device, model=model)()  # warm-up at a small size
                call = prepare(subjects[key], mode, (height, width), 1, config.device, model=model)
                first = time_call(call, config.device)
                if first <= config.max_call_seconds:
                    calls[key] = call
                else:
                    log(f"  {key} {mode} {height}x{width}: {first:.1f} s per call, over --max-call-seconds; skipped")
            samples = side_by_side(calls, config.repetitions, config.device)
            seconds[mode] = {key: median(samples[key]) if key in samples else None for key in models}
        for key, model in models.items():
            row: dict[str, Any] = {
                "model": key, "label": subjects[key].label, "height": height, "width": width,
                "padded": list(padded(height, width)), "trunk_params_m": param_count(model.backbone) / 1e6,
                "total_params_m": param_count(model) / 1e6, **costs[key]}
            for mode in config.modes:
                s = seconds[mode][key]
                row[f"{mode}_img_per_s"] = None if s is None else 1.0 / s
                if config.memory and s is not None:
                    log(f"  {key} {mode} {height}x{width}: peak memory")
                    try:
                        report = memory.measure("dense", key, mode, [height, width], 1, config.device)
                        row[f"{mode}_peak_mib"] = report.extra_mib
                    except memory.OutOfMemory:
                        row[f"{mode}_peak_mib"] = None
            rows.append(row)
    return {"machine": machine, "settings": {**config.__dict__, "sizes": [list(s) for s in config.sizes]},
            "rows": rows, "elapsed_s": time.perf_counter() - start}


def _number(value: Optional[float], digits: int) -> str:
    return "skipped" if value is None else f"{value:.{digits}f}"


def markdown_table(result: dict[str, Any]) -> str:
    from .results import describe, markdown_grid

    lines = [f"Backbone + 256-channel simple feature pyramid, batch 1, {describe(result['machine'])}.", ""]
    if result["machine"].get("command"):
        lines += [f"Command: `{result['machine']['command']}`.", ""]
    modes = result["settings"]["modes"]
    for height, width in result["settings"]["sizes"]:
        rows = [r for r in result["rows"] if (r["height"], r["width"]) == (height, width)]
        pad = rows[0]["padded"]
        lines += [f"### {height}×{width}" + (f" (padded to {pad[0]}×{pad[1]})" if pad != [height, width] else ""), ""]
        header = ["backbone", "trunk GMACs", "+ pyramid GMACs", "trunk params (M)", "+ pyramid params (M)"]
        header += [f"{mode} {what}" for mode in modes for what in ("img/s", "peak MiB")]
        lines += markdown_grid(header, [
            [r["label"], f"{r['trunk_gmacs']:.1f}", f"{r['total_gmacs']:.1f}", f"{r['trunk_params_m']:.2f}",
             f"{r['total_params_m']:.2f}", *(_number(r.get(f"{mode}_{what}"), digits) for mode in modes
                                            for what, digits in (("img_per_s", 3), ("peak_mib", 0)))]
            for r in rows]) + [""]
    return "\n".join(lines)


def run_command(args: Any, command: str) -> int:
    from ..engine.outputs import removed_if_failed
    from ..engine.run_dir import hold_run_folder
    from .results import claim_out_dir, default_out, log, write_results

    config = DenseBenchConfig(models=args.models, sizes=args.sizes, modes=args.modes, repetitions=args.repetitions,
                              max_call_seconds=args.max_call_seconds, device=args.device, memory=not args.no_memory)
    out = default_out(args.out, config.device, "dense")
    with removed_if_failed(out), hold_run_folder(out, "--out"):
        claim_out_dir(out, FILES, args.overwrite, "weightformer bench dense", log=log)
        result = run(config, log=log)
        result["machine"]["command"] = command
        table = markdown_table(result)
        print(table, flush=True)
        write_results(out, dict(zip(FILES, (result, table))))
    print(f"wrote {out / FILES[0]} and {out / FILES[1]} in {result['elapsed_s']:.0f} s")
    return 0
