"""Benchmarks: throughput, peak memory, FLOPs and parameters of WeightFormer against timm's DeiT.

A Python user can call the pieces directly::

    from weightformer.bench import Sweep, SweepConfig, write_all
    result = Sweep(SweepConfig(models=["wf-t", "deit-t"], resolutions=[224, 448])).run()
    write_all(result, "benchmarks/results/cpu")
"""

from .flops import FlopReport, attention_flops, count_flops
from .machine import describe, machine_info
from .memory import MemoryReport
from .memory import measure as measure_memory
from .report import markdown_table, plot_scaling, write_all, write_csv, write_json, write_markdown
from .sweep import Sweep, SweepConfig, attach_ratios
from .variants import VARIANTS, Variant, build_model, get_variant, param_count

__all__ = [
    "FlopReport",
    "MemoryReport",
    "Sweep",
    "SweepConfig",
    "VARIANTS",
    "Variant",
    "attach_ratios",
    "attention_flops",
    "build_model",
    "count_flops",
    "describe",
    "get_variant",
    "machine_info",
    "markdown_table",
    "measure_memory",
    "param_count",
    "plot_scaling",
    "write_all",
    "write_csv",
    "write_json",
    "write_markdown",
]
