"""``weightformer bench dit``: WF-DiT against DiT with fused and explicit attention; the table and JSON it
writes, its per-call budget (predicted time, predicted memory, the cut-off), its memory worker, bad input.

No test asserts a time: where the budget logic is checked, the clock is replaced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightformer.cli import main
from weightformer.bench import dit, timing
from weightformer.bench.subjects import dit_subject, get_subject

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(hidden_size=32, depth=2, num_heads=2)
MODELS = ["wf_dit_s_8", "dit_s_8"]
KEYS = ["wf_dit_s_8", "dit_s_8 fused", "dit_s_8 explicit"]


def test_writes_json_and_markdown_and_cuts_off_slow_points(tmp_path: Path):
    out = tmp_path / "dit"
    assert main(["bench", "dit", "--models", *MODELS, "--sides", "8", "16", "--repeats", "1", "--no-memory",
                 "--max-seconds", "1e-9", "--out", str(out)]) == 0
    document = json.loads((out / "dit.json").read_text())
    rows = document["rows"]
    assert document["machine"]["cpu"] and document["machine"]["load_average"] and len(rows) == 2 * 2 * 3
    assert {r["model"] for r in rows} == set(KEYS)
    first = [r for r in rows if r["side"] == 8]
    assert all(r.get("cut_off") and "one call took" in r["reason"] for r in first)  # every call is slower than 1 ns
    assert all(r["status"] == "skipped" and "a smaller side" in r["reason"] for r in rows if r["side"] == 16)
    table = (out / "dit.md").read_text()
    assert "| 8 (64) | 1 | forward |" in table and "DiG-S/2" in table and "(1 call, cut off)" in table
    assert "Command: `weightformer bench dit --models wf_dit_s_8 dit_s_8" in table
    assert "load average at start" in table and "1 threads" in table
    assert "speed-up vs dit_s_8 fused" in table and "memory ratio vs dit_s_8 explicit" in table


def test_fused_and_explicit_attention_compute_the_same_model():
    """The two attention rows differ in how attention is computed, not in what."""
    import torch

    side = 16
    x = torch.randn(1, 4, side, side)
    t, y = torch.tensor([10]), torch.tensor([3])
    outputs = []
    for kind in dit.ATTENTION:
        model = dit_subject("dit_s_8", kind).build(side, "cpu", **TINY).eval()
        assert {m.fused_attn for m in model.modules() if hasattr(m, "fused_attn")} == {kind == "fused"}
        with torch.no_grad():
            outputs.append(model(x, t, y))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-4, atol=1e-5)


def _fake_clock(monkeypatch, seconds: float = 1.0) -> None:
    """Every timed call "takes" ``seconds``; the calls still run (they must not fail)."""

    def time_call(fn, device, iterations=1):
        for _ in range(iterations):
            fn()
        return seconds

    monkeypatch.setattr(timing, "time_call", time_call)


def test_side_224_is_measured_with_memory_and_explicit_training_is_predicted_out_of_memory(monkeypatch):
    """Side 224 (1792² px) runs for WF-DiT and DiT (explicit attention: fused is the same path) in both
    modes, within the budget, with extra peak memory from the fresh-process worker; where explicit
    attention's scores would not fit, the point is "out of memory (predicted)" and is not run."""
    _fake_clock(monkeypatch)
    # tiny DiT /8 at side 224: 784 tokens, 2 heads: 4.9 MB of scores per block; forward 9.8 MB, training 19.7 MB
    forward_need = dit.score_bytes(dit_subject("dit_s_8", "explicit"), 224, 1, "forward", TINY)
    train_need = dit.score_bytes(dit_subject("dit_s_8", "explicit"), 224, 1, "train", TINY)
    assert forward_need == 2 * 2 * 784 * 784 * 4 and train_need == (TINY["depth"] + 2) * 2 * 784 * 784 * 4
    assert dit.score_bytes(dit_subject("dit_s_8", "fused"), 224, 1, "train", TINY) == 0
    monkeypatch.setattr(dit, "available_bytes", lambda device: (forward_need + train_need) / 2 / dit.MEMORY_SHARE)
    rows = dit.benchmark(MODELS, [224], repeats=1, max_seconds=10.0, model_kwargs=TINY, attention=["explicit"])
    index = {(r["model"], r["mode"]): r for r in rows}
    assert set(index) == {(k, mode) for k in (KEYS[0], KEYS[2]) for mode in dit.MODES}
    explicit_train = index[("dit_s_8 explicit", "train")]
    assert explicit_train["status"] == "oom" and explicit_train["oom"] == "predicted"
    assert "out of memory (predicted)" in explicit_train["reason"] and "extra_mib" not in explicit_train
    measured = [r for r in rows if r is not explicit_train]
    for row in measured:
        assert row["status"] == "ok" and row["seconds"] == 1.0 and row["tokens"] == 784, row
        assert row["extra_mib"] == pytest.approx(row["peak_mib"] - row["baseline_mib"]) and row["baseline_mib"] > 0
    table = dit.markdown({"machine": _machine(), "config": _config(), "sides_done": [224], "rows": rows})
    line = next(line for line in table.splitlines() if line.startswith("| 224 (1792) | 784 | train |"))
    assert "OOM (predicted)" in line
    assert "dit_s_8 explicit, train, side 224: out of memory (predicted)" in table


def test_the_budget_skips_points_predicted_over_it_from_the_last_side(monkeypatch):
    _fake_clock(monkeypatch)  # every call: 1 s; the budget: 3 s
    rows = dit.benchmark(MODELS, [16, 224], repeats=1, max_seconds=3.0, memory=False, model_kwargs=TINY)
    index = {(r["model"], r["side"], r["mode"]): r for r in rows}
    for key in KEYS:
        assert index[(key, 16, "forward")]["status"] == "ok"
        assert index[(key, 16, "train")]["predicted_seconds"] == 3.0  # 3x the forward at the same side
        big = index[(key, 224, "forward")]
        flops = dit.forward_flops(get_subject("dit", key), 224, 1, TINY) / dit.forward_flops(
            get_subject("dit", key), 16, 1, TINY)
        assert big["status"] == "skipped" and big["predicted_seconds"] == pytest.approx(flops)
        assert "exceeds the 3 s budget" in big["reason"]


def test_running_out_of_memory_is_a_measured_outcome(monkeypatch):
    """A call that runs out of memory, or a memory worker killed by the OOM killer, is recorded as
    "out of memory (measured)" and the benchmark goes on."""
    import signal
    import subprocess

    _fake_clock(monkeypatch)
    build = dit._call

    def call(entry, side, batch, mode, device, model_kwargs=None):
        if entry.attention == "explicit" and mode == "train":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory")
        return build(entry, side, batch, mode, device, model_kwargs)

    monkeypatch.setattr(dit, "_call", call)
    monkeypatch.setattr(dit.subprocess, "run", lambda args, **kwargs: subprocess.CompletedProcess(args, -signal.SIGKILL))
    rows = dit.benchmark(MODELS, [16, 32], repeats=1, max_seconds=100.0, model_kwargs=TINY, attention=["explicit"])
    index = {(r["model"], r["side"], r["mode"]): r for r in rows}
    failed = index[("dit_s_8 explicit", 16, "train")]
    assert failed["status"] == "oom" and failed["oom"] == "measured" and "can't allocate" in failed["reason"]
    assert index[("dit_s_8 explicit", 32, "train")]["reason"] == "out of memory at a smaller side"
    killed = index[("wf_dit_s_8", 16, "forward")]
    assert killed["status"] == "ok" and "SIGKILL" in killed["memory_oom"] and "extra_mib" not in killed


def _machine():
    from weightformer.bench.results import machine_info

    return machine_info("cpu", command="weightformer bench dit (test)")


def _config():
    return {"models": MODELS, "attention": ["explicit"], "device": "cpu", "batch": 1, "repeats": 1,
            "max_seconds": 10.0}


def test_sides_to_224_and_the_model_order_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture):
    from weightformer.bench.cli import dit_parser

    assert dit_parser().parse_args([]).sides == [32, 64, 128, 224]
    assert main(["bench", "dit", "--models", "dit_s_2", "wf_dit_s_2", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a WeightFormer-DiT, then an attention DiT" in err[0]


def test_bad_model_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["bench", "dit", "--models", "wf_dit_s_3", "dit_s_2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown model")
