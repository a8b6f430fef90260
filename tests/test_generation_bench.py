"""``weightformer bench dit``: the table and JSON it writes, the cut-off, its memory worker, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightformer.bench import dit

pytestmark = pytest.mark.usefixtures("one_thread")


def test_writes_json_and_markdown_and_cuts_off_slow_points(tmp_path: Path):
    out = tmp_path / "dit"
    assert dit.main(["--models", "wf_dit_s_8", "dit_s_8", "--sides", "8", "16", "--repeats", "1", "--no-memory",
                     "--max-seconds", "1e-9", "--out", str(out)]) == 0
    document = json.loads((out / "dit.json").read_text())
    rows = document["rows"]
    assert document["machine"]["cpu"] and len(rows) == 2 * 2 * 2
    first = [r for r in rows if r["side"] == 8]
    assert all("one call took" in r["skipped"] for r in first)  # every call is slower than 1 ns
    assert all("a smaller side" in r["skipped"] for r in rows if r["side"] == 16)
    table = (out / "dit.md").read_text()
    assert "| 8 (64) | 1 | forward |" in table and "DiG-S/2" in table


def test_times_both_models_and_measures_memory(capsys: pytest.CaptureFixture):
    tiny = dict(hidden_size=32, depth=2, num_heads=2)
    rows = dit.benchmark(["wf_dit_s_8", "dit_s_8"], [16], repeats=1, memory=False, model_kwargs=tiny)
    assert {(r["model"], r["mode"]) for r in rows if r["seconds"] > 0} == {
        (m, mode) for m in ("wf_dit_s_8", "dit_s_8") for mode in dit.MODES}
    assert dit._peak_memory_mib("dit_s_8", 16, 1, "train", "cpu", tiny) > 0  # in a fresh subprocess


def test_bad_model_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert dit.main(["--models", "wf_dit_s_3", "dit_s_2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown model")
