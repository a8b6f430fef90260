"""Benchmarks: throughput, peak memory, FLOPs and parameters of WeightFormer against timm's DeiT and DiT.

One list of subjects (:mod:`.subjects`), one side-by-side timer (:mod:`.timing`), one memory probe
(:mod:`.memory`), one results writer (:mod:`.results`), used by the classification sweep (:mod:`.sweep`),
the dense cost table (:mod:`.dense`), the DiT table (:mod:`.dit`) and the export timing
(:mod:`weightformer.bench.export`). A Python user can call the pieces directly::

    from weightformer.bench import Sweep, SweepConfig, write_all
    result = Sweep(SweepConfig(models=["wf-t", "deit-t"], resolutions=[224, 448])).run()
    write_all(result, "benchmarks/results/cpu")

The names below are loaded when first used, so that ``weightformer bench --help`` imports no torch.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "count_flops": "flops", "Journal": "journal", "JournalMismatch": "journal", "MemoryReport": "memory",
    "OutOfMemory": "memory", "cuda_peak": "memory", "is_oom": "memory", "measure": "memory",
    "describe": "results", "machine_info": "results", "write_results": "results", "SUBJECTS": "subjects",
    "Subject": "subjects", "get_subject": "subjects", "make_call": "subjects", "Sweep": "sweep",
    "SweepConfig": "sweep", "attach_ratios": "sweep", "markdown_table": "sweep", "write_all": "sweep",
    "median": "timing", "side_by_side": "timing", "time_call": "timing",
})
