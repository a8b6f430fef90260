"""Benchmarks: throughput, peak memory, FLOPs and parameters of WeightFormer against timm's DeiT.

A Python user can call the pieces directly::

    from weightformer.bench import Sweep, SweepConfig, write_all
    result = Sweep(SweepConfig(models=["wf-t", "deit-t"], resolutions=[224, 448])).run()
    write_all(result, "benchmarks/results/cpu")

``Sweep(config, journal=Path("out/points.jsonl"), resume=True)`` appends each point to the journal as it
is measured and takes the points already there instead of measuring them again.

The names below are loaded when first used (PEP 562), so that ``weightformer bench --help``, which
imports ``weightformer.bench.cli``, does not import torch.
"""

from importlib import import_module
from typing import Any

# public name -> (module of this package, its name there)
_EXPORTS = {
    "FlopReport": ("flops", "FlopReport"),
    "attention_flops": ("flops", "attention_flops"),
    "count_flops": ("flops", "count_flops"),
    "Journal": ("journal", "Journal"),
    "JournalMismatch": ("journal", "JournalMismatch"),
    "describe": ("machine", "describe"),
    "machine_info": ("machine", "machine_info"),
    "MemoryReport": ("memory", "MemoryReport"),
    "OutOfMemory": ("memory", "OutOfMemory"),
    "cuda_peak": ("memory", "cuda_peak"),
    "is_oom": ("memory", "is_oom"),
    "measure_memory": ("memory", "measure"),
    "check_out_dir": ("report", "check_out_dir"),
    "claim_out_dir": ("report", "claim_out_dir"),
    "markdown_table": ("report", "markdown_table"),
    "plot_scaling": ("report", "plot_scaling"),
    "write_all": ("report", "write_all"),
    "write_csv": ("report", "write_csv"),
    "write_json": ("report", "write_json"),
    "write_markdown": ("report", "write_markdown"),
    "Sweep": ("sweep", "Sweep"),
    "SweepConfig": ("sweep", "SweepConfig"),
    "attach_ratios": ("sweep", "attach_ratios"),
    "VARIANTS": ("variants", "VARIANTS"),
    "Variant": ("variants", "Variant"),
    "build_variant": ("variants", "build_variant"),
    "get_variant": ("variants", "get_variant"),
    "param_count": ("variants", "param_count"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    value = getattr(import_module(f".{module}", __name__), attribute)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list:
    return sorted([*globals(), *_EXPORTS])
