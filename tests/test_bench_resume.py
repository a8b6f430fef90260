"""The sweep's journal: a killed sweep keeps its points, ``--resume`` measures only the rest, once each."""

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from weightformer.bench.journal import JOURNAL_NAME, Journal, JournalMismatch
from weightformer.bench.sweep import Sweep
from weightformer.cli import main

# Two models at 32 px: inference (2 points) and FLOPs (2), one fast repetition each.
TINY = ["--models", "wf-t,deit-t", "--resolutions", "32", "--measure", "infer,flops", "--batch", "2",
        "--repetitions", "1", "--min-rep-seconds", "0", "--threads", "1", "--device", "cpu"]
KILL_AFTER = 1  # point: wf-t's inference, the first of the round-robin group's two

# Runs the sweep and SIGKILLs itself right after the KILL_AFTER-th point is on disk.
KILLED_SWEEP = """
import os, signal, sys
from weightformer.bench import journal
from weightformer.cli import main
append = journal.Journal.append
def append_then_die(self, key, record):
    append(self, key, record)
    if len(self.entries) == {kill_after}:
        os.kill(os.getpid(), signal.SIGKILL)
journal.Journal.append = append_then_die
main(["bench", *sys.argv[1:]])
"""


def _journal_lines(out: Path) -> list:
    return [json.loads(line) for line in (out / JOURNAL_NAME).read_text().splitlines()]


def test_killed_sweep_resumes_measuring_only_the_rest(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_SWEEP.format(kill_after=KILL_AFTER), *TINY, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / "results.json").exists()
    before = _journal_lines(out)[1:]
    assert len(before) == KILL_AFTER

    measured = []
    prepare, count = Sweep._prepare_call, Sweep._count
    monkeypatch.setattr(Sweep, "_prepare_call", (
        lambda self, v, *a: measured.append((v.name, a[-1])) or prepare(self, v, *a)
    ))
    monkeypatch.setattr(Sweep, "_count", lambda self, v, *a: measured.append((v.name, "flops")) or count(self, v, *a))
    assert main(["bench", *TINY, "--out", str(out), "--resume"]) == 0
    assert "3 points measured, 1 taken from" in capsys.readouterr().out
    assert sorted(measured) == [("deit-t", "flops"), ("deit-t", "infer"), ("wf-t", "flops")]

    points = _journal_lines(out)[1:]
    keys = [tuple(p["key"]) for p in points]
    assert len(keys) == 4 == len(set(keys)) and points[:KILL_AFTER] == before
    result = json.loads((out / "results.json").read_text())
    assert result["points_measured"] == 3 and result["points_reused"] == 1
    rows = {(r["model"], r["measurement"]): r for r in result["rows"]}
    assert len(rows) == len(result["rows"]) == 2 and all(r["status"] == "ok" for r in result["rows"])
    # wf-t's inference row is the one measured before the kill, not a new measurement.
    first = {tuple(p["key"]): p for p in before}
    measured_before = first[("wf-t", 32, 2, "infer_throughput")]["row"]
    assert rows[("wf-t", "infer_throughput")]["samples_s"] == measured_before["samples_s"]
    assert sorted(f["model"] for f in result["flops"]) == ["deit-t", "wf-t"]
    assert all(r["gmacs_per_image"] > 0 and r["params"] > 0 for r in result["rows"])
    table = list(csv.DictReader((out / "results.csv").read_text().splitlines()[1:]))
    assert sorted((r["model"], r["measurement"]) for r in table) == sorted(rows)
    markdown = (out / "results.md").read_text()
    assert markdown.count("| WeightFormer-T |") == 1 and markdown.count("| DeiT-T fused attn |") == 1


SETTINGS = {"device": "cpu", "dtype": "float32", "repetitions": 3, "threads": 2, "machine": {"torch": "2.x"}}


def test_partial_last_line_is_dropped_and_cut_from_the_file(tmp_path):
    path = tmp_path / JOURNAL_NAME
    journal = Journal(path, SETTINGS)
    journal.append(("wf-t", 224, 1, "infer_throughput"), {"row": {"value": 1.0}})
    journal.append(("deit-t", 224, 1, "infer_throughput"), {"row": {"value": 2.0}})
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(b'{"key": ["wf-t", 224, 1, "train_thr')  # killed mid-write
    resumed = Journal(path, SETTINGS, resume=True)
    assert set(resumed.entries) == {("wf-t", 224, 1, "infer_throughput"), ("deit-t", 224, 1, "infer_throughput")}
    assert path.read_bytes() == whole
    resumed.append(("wf-t", 224, 1, "train_throughput"), {"row": {"value": 3.0}})
    assert len(Journal(path, SETTINGS, resume=True).entries) == 3


@pytest.mark.parametrize("change", [{"dtype": "bfloat16"}, {"repetitions": 5}, {"machine": {"torch": "3.x"}}])
def test_resume_with_other_settings_is_refused(tmp_path, change):
    path = tmp_path / JOURNAL_NAME
    Journal(path, SETTINGS).append(("wf-t", 224, 1, "infer_throughput"), {"row": {}})
    with pytest.raises(JournalMismatch, match=f"{next(iter(change))}.*rerun with the same settings"):
        Journal(path, {**SETTINGS, **change}, resume=True)
    # Without resume, the journal starts afresh (and says how many points it dropped).
    fresh = Journal(path, {**SETTINGS, **change})
    assert fresh.entries == {} and fresh.discarded == 1 and len(path.read_text().splitlines()) == 1


def test_cli_resume_with_other_settings_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Sweep, "_run", lambda self: pytest.fail("measured although the journal did not match"))
    out = tmp_path / "out"
    out.mkdir()
    settings = {"device": "cpu", "dtype": "float32", "repetitions": 1, "min_rep_seconds": 0.0, "max_call_seconds": 15.0,
                "threads": 1, "machine": {}}
    Journal(out / JOURNAL_NAME, settings).append(("wf-t", 32, 2, "infer_throughput"), {"row": {}})
    assert main(["bench", *TINY, "--repetitions", "2", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cannot resume from") and "repetitions 1 there, 2 now" in err
    assert len(err.splitlines()) == 1


def test_result_file_interrupted_mid_write_keeps_the_previous_one(tmp_path, monkeypatch):
    from weightformer.bench.results import write_results

    path = tmp_path / "results.json"
    path.write_text('{"rows": ["previous"]}\n')

    def killed(fd):
        raise KeyboardInterrupt  # stands for a kill after part of the new file is written

    monkeypatch.setattr(os, "fsync", killed)
    with pytest.raises(KeyboardInterrupt):
        write_results(tmp_path, {"results.json": {"rows": ["new"] * 1000}})
    assert path.read_text() == '{"rows": ["previous"]}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left behind
