"""Behaviour of the benchmark harness on tiny configurations; no timed assertions."""

import argparse
import csv
import importlib.util
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from weightformer.bench import Sweep, SweepConfig, attach_ratios, count_flops, get_subject, measure, write_all
from weightformer.bench.cli import add_arguments, config_from_args, parse_batches
from weightformer.bench.subjects import SUBJECTS, suite
from weightformer.bench.timing import median, paired_ratio, side_by_side
from weightformer.bench.sweep import csv_text, markdown_table
from weightformer.engine.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_fused_attention_is_counted_as_its_explicit_matmuls():
    """Torch's counter misses fused CPU attention; count_flops switches it to explicit matmuls while counting."""
    images = torch.randn(1, 3, 32, 32)
    fused_model = get_subject("cls", "deit-t").build(32)
    explicit_model = get_subject("cls", "deit-t-explicit").build(32)
    fused, explicit = count_flops(fused_model, images), count_flops(explicit_model, images)
    assert fused.flops == explicit.flops and fused.macs == fused.flops // 2
    assert all(m.fused_attn for m in fused_model.modules() if hasattr(m, "fused_attn"))  # restored after counting
    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        fused_model(images)
    tokens, dim, blocks = 5, 192, 12  # 4 patches and a class token: the two matmuls, 4·N²·D each block
    assert explicit.flops - counter.get_total_flops() == blocks * 4 * tokens * tokens * dim


def test_every_subject_is_one_entry_of_one_list():
    assert len({(s.suite, s.name) for s in SUBJECTS}) == len(SUBJECTS)
    assert {s.suite for s in SUBJECTS} == {"cls", "dense", "dit", "export"}
    assert set(suite("cls")) >= {"wf-t", "wf-t-naive", "wf-t-ckpt", "deit-t", "deit-t-explicit", "wf-s", "deit-s"}
    with pytest.raises(ValueError, match="unknown model 'resnet'; choose from wf-t"):
        get_subject("cls", "resnet")


def test_median_and_ratios():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        median([])
    rows = [
        {"model": m, "baseline_model": "deit-t", "resolution": 224, "batch": 1, "measurement": "infer_throughput",
         "status": "ok", "value": v, "ratio_vs_baseline": None}
        for m, v in (("deit-t", 4.0), ("wf-t", 10.0))
    ]
    attach_ratios(rows)
    assert rows[0]["ratio_vs_baseline"] == 1.0
    assert rows[1]["ratio_vs_baseline"] == 2.5


def test_a_ratio_timed_side_by_side_is_the_median_of_each_rounds_ratio():
    # Rounds 2 and 3 ran under load that slowed both models alike, and in rounds 4 and 5 a burst slowed WF
    # alone: WF is twice as fast in most rounds, which the medians' ratio (1.0) does not see.
    deit, wf = [1.0, 3.0, 3.0, 1.5, 1.2], [0.5, 1.5, 1.5, 1.5, 1.2]
    assert median(deit) / median(wf) == pytest.approx(1.0)
    assert paired_ratio(deit, wf) == pytest.approx(2.0)
    rows = [{"model": m, "baseline_model": "deit-t", "resolution": 224, "batch": 16, "measurement": "infer_throughput",
             "status": "ok", "value": 16 / median(samples), "samples_s": samples, "ratio_vs_baseline": None}
            for m, samples in (("deit-t", deit), ("wf-t", wf))]
    attach_ratios(rows)
    assert rows[1]["ratio_vs_baseline"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="side by side"):
        paired_ratio([1.0, 2.0], [1.0])


FAULTS_OF_A_64_MIB_TENSOR = """
import resource, sys, torch
from weightformer.bench.timing import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "cached" else None
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(2**24)  # 64 MiB, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
for _ in range(3):  # the heap settles (it grows while the first blocks are placed)
    faults()
print(kept, sum(faults() for _ in range(3)))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_keeping_freed_memory_stops_the_second_allocation_from_faulting_its_pages_in():
    def run(allocator):
        out = subprocess.run([sys.executable, "-c", FAULTS_OF_A_64_MIB_TENSOR, allocator], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], int(out[1])

    kept, faults = run("cached")
    _, system_faults = run("system")
    assert kept == "True"
    assert system_faults > 3 * 8000  # glibc maps a block this large afresh each time: 16,384 pages of 4 KiB
    assert faults < 0.05 * system_faults


def test_the_timer_interleaves_the_models():
    order = []
    calls = {key: (lambda key=key: order.append(key)) for key in ("a", "b", "c")}
    samples = side_by_side(calls, repetitions=2, device="cpu", iterations={"b": 2})
    assert order == ["a", "b", "b", "c", "a", "b", "b", "c"]
    assert {key: len(v) for key, v in samples.items()} == {"a": 2, "b": 2, "c": 2}


def test_memory_subprocess_reports_positive_peak():
    report = measure("cls", "wf-t", "infer", 32, 1)
    assert report.peak_mib > report.baseline_mib > 0
    assert report.extra_mib == pytest.approx(report.peak_mib - report.baseline_mib)


def test_sweep_writes_well_formed_outputs(tmp_path):
    config = SweepConfig(
        models=["wf-t", "deit-t"],
        resolutions=[32],
        default_batch=2,
        measurements=("infer", "train", "flops"),
        repetitions=2,
        min_rep_seconds=0.0,
        threads=1,
    )
    threads = torch.get_num_threads()
    result = Sweep(config, log=lambda _: None).run()
    assert torch.get_num_threads() == threads
    json_path, csv_path, md_path, png_path = write_all(result, tmp_path)

    document = json.loads(json_path.read_text())
    assert {"cpu", "cpu_count", "torch", "torch_threads", "date"} <= set(document["machine"])
    rows = document["rows"]
    assert {(r["model"], r["measurement"]) for r in rows} == {
        (m, k) for m in ("wf-t", "deit-t") for k in ("infer_throughput", "train_throughput")
    }
    for row in rows:
        assert row["status"] == "ok" and row["value"] > 0 and len(row["samples_s"]) == 2
        assert row["params"] > 0 and row["gmacs_per_image"] > 0
        if row["model"] == "deit-t":
            assert row["ratio_vs_baseline"] == 1.0

    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("# machine:")
    table = list(csv.DictReader(lines[1:]))
    assert len(table) == len(rows) and float(table[0]["value"]) > 0

    markdown = md_path.read_text()
    assert "### 32×32 (batch 2)" in markdown and "| WeightFormer-T |" in markdown
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_times_each_model_in_each_runtime_and_precision(monkeypatch):
    """Variants: names, labels, ratios against the DeiT of the same runtime and precision, the compiled
    variants' first call apart, and FLOPs shared by all variants of a subject. Compilation is stood in for
    (Inductor takes minutes on this CPU; tests/test_compile*.py compare it with eager)."""
    import weightformer.engine.loop as loop

    compiled = []
    monkeypatch.setattr(loop, "compiled", lambda model, backend: compiled.append(backend) or model)
    config = SweepConfig(models=["wf-t", "deit-t"], resolutions=[32], measurements=("infer", "flops"),
                         dtypes=("float32", "bfloat16"), runtimes=("eager", "compile"), repetitions=1,
                         min_rep_seconds=0.0, threads=1)
    result = Sweep(config, log=lambda _: None).run()
    rows = {r["model"]: r for r in result["rows"]}
    assert list(rows) == ["wf-t", "wf-t+bf16", "wf-t+compile", "wf-t+compile+bf16",
                          "deit-t", "deit-t+bf16", "deit-t+compile", "deit-t+compile+bf16"]
    assert compiled == ["inductor"] * 4
    assert rows["wf-t+compile+bf16"]["label"] == "WeightFormer-T (torch.compile, bf16)"
    for name, row in rows.items():
        assert row["status"] == "ok" and row["baseline_model"] == name.replace("wf-t", "deit-t")
        assert row["ratio_vs_baseline"] == pytest.approx(row["value"] / rows[row["baseline_model"]]["value"])
        assert (row["first_call_s"] is not None) == (row["runtime"] == "compile") and row["params"] > 0
    markdown = markdown_table(result)
    assert "| DeiT-T fused attn (bf16) |" in markdown
    assert "- WeightFormer-T (torch.compile), infer, 32px:" in markdown
    table = list(csv.DictReader(csv_text(result).splitlines()[1:]))
    assert {(r["runtime"], r["dtype"]) for r in table} == {(a, b) for a in ("eager", "compile")
                                                            for b in ("float32", "bfloat16")}


def test_sweep_skips_points_over_the_time_budget():
    config = SweepConfig(models=["wf-t"], resolutions=[32], measurements=("infer",), max_call_seconds=1.0)
    sweep = Sweep(config, log=lambda _: None)
    sweep.rates[("wf-t", "infer")] = 1.0  # one FLOP per second: any real point is far over budget
    rows = sweep.run()["rows"]
    assert [r["status"] for r in rows] == ["skipped"]
    assert "budget" in rows[0]["reason"]


def test_cli_options_build_a_config():
    assert parse_batches("224:16,448:4,1") == ({224: 16, 448: 4}, 1)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_batches("224:x")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--models", "wf-t,deit-t", "--resolutions", "224,448", "--batch", "224:8,2", "--device", "cpu"])
    config = config_from_args(args)
    assert config.models == ["wf-t", "deit-t"] and config.resolutions == [224, 448]
    assert config.batch_for(224) == 8 and config.batch_for(448) == 2
    with pytest.raises(ValueError, match="unknown model"):
        SweepConfig(models=["resnet"], resolutions=[224])


def test_gpu_largest_batch_bisection(monkeypatch):
    gpu = _gpu_script()
    monkeypatch.setattr(gpu, "_fits", lambda model, batch, resolution, device: batch <= 37)
    assert gpu.largest_batch(None, 1248, "cuda", max_batch=4096) == 37
    assert gpu.largest_batch(None, 1248, "cuda", max_batch=16) == 16
    monkeypatch.setattr(gpu, "_fits", lambda model, batch, resolution, device: False)
    assert gpu.largest_batch(None, 1248, "cuda", max_batch=16) == 0


def _gpu_script():
    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    return gpu


def test_gpu_runtimes_are_checked():
    gpu = _gpu_script()
    assert gpu.parse_runtimes("eager,compile") == ["eager", "compile"]
    for text in ("", "eager,jit"):
        with pytest.raises(ConfigError, match="--runtimes must be a comma-separated list of compile, eager"):
            gpu.parse_runtimes(text)
    assert gpu.relative_difference(torch.ones(4), torch.ones(4)) == 0.0
    assert gpu.relative_difference(torch.tensor([0.0, 10.0]), torch.tensor([0.0, 5.0])) == pytest.approx(1.0)


def test_gpu_targets_against_each_baseline():
    gpu = _gpu_script()

    def row(img_per_s, **peaks):
        return {"img_per_s": img_per_s, "memory_at_batch_of": {k.replace("_", "-"): {"peak_gib": v} for k, v in peaks.items()}}

    results = {"wf-t": row(800.0, deit_t=4.0, deit_t_explicit=1.0), "deit-t": row(100.0, deit_t=50.0),
               "deit-t-explicit": row(200.0, deit_t_explicit=20.0)}
    rows = {(r["target"], r["runtime"]): r for r in gpu.targets(results, "eager")}
    fused = rows[("1248² bf16 throughput, largest batches: WeightFormer-T / deit-t", "eager")]
    assert fused["measured"] == 8.0 and fused["met"] is True
    explicit = rows[("1248² bf16 throughput, largest batches: WeightFormer-T / deit-t-explicit", "eager")]
    assert explicit["measured"] == 4.0 and explicit["met"] is False
    memory = rows[("1248² bf16 peak memory at deit-t-explicit's largest batch: WeightFormer-T / deit-t-explicit", "eager")]
    assert memory["measured"] == pytest.approx(0.05) and memory["met"] is True
    assert gpu.targets({"deit-t": row(1.0, deit_t=1.0)}, "compile")[0]["met"] is None


def test_gpu_out_of_memory_reported_as_a_cuda_error_is_a_batch_that_does_not_fit(monkeypatch):
    gpu = _gpu_script()
    monkeypatch.setattr(gpu, "_release", lambda: None)
    monkeypatch.setattr(gpu, "_images", lambda batch, resolution, device: None)
    monkeypatch.setattr(gpu.torch.cuda, "synchronize", lambda device: None)

    def failing(message):
        def make(model, images, dtype):
            def call():
                raise RuntimeError(message)
            return call
        return make

    monkeypatch.setattr(gpu, "inference_call", failing("CUDA error: out of memory"))
    assert gpu._fits(None, 8, 1248, "cuda") is False
    monkeypatch.setattr(gpu, "inference_call", failing("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        gpu._fits(None, 8, 1248, "cuda")


def test_gpu_script_keeps_an_earlier_result_unless_told(monkeypatch, tmp_path, capsys):
    """The stages' bookkeeping without a GPU: one JSON per GPU, written after each stage through the shared
    writer, and an earlier result of the same GPU refused in one line unless --overwrite moves it aside."""
    gpu = _gpu_script()
    monkeypatch.setattr(gpu.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu, "machine_info", lambda device: {"gpu": "Test GPU (H) 1"})
    monkeypatch.setattr(gpu, "describe", lambda machine: "test machine")
    stages = []

    def compare(models, resolution, device, max_batch, repetitions, runtime):
        stages.append((resolution, runtime))
        return {key: {"largest_batch": 1} for key in models}

    monkeypatch.setattr(gpu, "compare", compare)
    monkeypatch.setattr(gpu, "agreement", lambda device: stages.append("agreement") or {"sizes": {}})
    argv = ["--out-dir", str(tmp_path), "--resolutions", "1248,64", "--models", "wf-t"]
    assert gpu.main(argv) == 0
    assert stages == [(1248, "eager"), (1248, "compile"), "agreement", (64, "eager"), (64, "compile")]
    written = json.loads((tmp_path / "gpu_test_gpu_h_1.json").read_text())
    assert set(written["runtimes"]["compile"]) == {"1248", "64"} and "agreement" in written
    assert written["targets"][0]["met"] is None  # no DeiT-T ran: the targets say so
    capsys.readouterr()
    assert gpu.main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: --out-dir ") and "gpu_test_gpu_h_1.json" in err and "--overwrite" in err
    assert len(err.splitlines()) == 1 and len(stages) == 5  # refused before measuring
    assert gpu.main(argv + ["--overwrite"]) == 0
    assert len(list(tmp_path.glob("gpu_test_gpu_h_1.json*"))) == 2  # the earlier result moved aside, not lost
