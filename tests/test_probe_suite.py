"""benchmarks/examples/probe_suite.py's table: runs kept from an earlier record (``--keep``) beside fresh ones."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def suite(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "examples"))
    import probe_suite

    return probe_suite


def _record(path: Path, runs: list[tuple[str, str, int, float, float]], epochs: int = 12, images: int = 2000) -> Path:
    """A designs.json as the script writes it, with only what ``--keep`` reads."""
    path.write_text(json.dumps({
        "command": "python benchmarks/examples/probe_suite.py --earlier", "machine": {"cpu": "the earlier one"},
        "epochs": epochs, "eval_images": images,
        "runs": [{"design": d, "probe": p, "seed": s, "command": f"weightformer train {d} {p} {s}",
                  "accuracy": {"64": small, "128": large}} for d, p, s, small, large in runs]}))
    return path


def test_kept_runs_join_the_table_with_their_own_numbers(suite, tmp_path):
    earlier = _record(tmp_path / "earlier.json", [("long_range_led", "glyph_xor", 1, 100.0, 98.8),
                                                  ("long_range_led", "glyph_xor", 0, 100.0, 96.0),
                                                  ("long_range", "glyph_match", 0, 70.8, 69.8)])
    out = tmp_path / "designs"
    assert suite.main(["--designs", "long_range_led", "--table-only", "--runs", str(tmp_path / "none"),
                       "--keep", str(earlier), "--out", str(out)]) == 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert [(r["design"], r["probe"], r["seed"]) for r in record["runs"]] == [  # DESIGNS' order, then seeds
        ("long_range", "glyph_match", 0), ("long_range_led", "glyph_xor", 0), ("long_range_led", "glyph_xor", 1)]
    assert record["summary"]["long_range_led"]["glyph_xor"]["large"] == [96.0, 98.8]
    assert record["kept_from"] == {"path": str(earlier), "command": "python benchmarks/examples/probe_suite.py "
                                   "--earlier", "machine": {"cpu": "the earlier one"}}
    text = out.with_suffix(".md").read_text()
    assert "| long_range_led | glyph_xor | 2 | 100.0 ± 0.0 | 97.4 ± 2.0 | 0.97 ± 0.02 |" in text
    assert "70.8 → 69.8" in text and out.with_suffix(".png").stat().st_size > 0


def test_a_fresh_run_replaces_the_kept_one_of_the_same_design_probe_and_seed(suite, tmp_path, monkeypatch):
    earlier = _record(tmp_path / "earlier.json", [("long_range_led", "glyph_xor", 0, 100.0, 96.0),
                                                  ("long_range_led", "glyph_xor", 1, 100.0, 98.8)])
    run = tmp_path / "runs" / "long_range_led" / "glyph_xor" / "seed0"
    run.mkdir(parents=True)
    (run / "last.pt").write_bytes(b"")  # read by no one: the evaluation is replaced below
    monkeypatch.setattr(suite, "epochs_done", lambda folder: 12 if folder == run else 0)
    monkeypatch.setattr(suite, "evaluate", lambda checkpoints, cache, images: [
        {"trained_on": suite.probe_data("glyph_xor"), "accuracy": {"64": 99.0, "128": 99.5}} for _ in checkpoints])
    out = tmp_path / "designs"
    suite.main(["--designs", "long_range_led", "--probes", "glyph_xor", "--seeds", "0", "--table-only",
                "--runs", str(tmp_path / "runs"), "--keep", str(earlier), "--out", str(out)])
    summary = json.loads(out.with_suffix(".json").read_text())["summary"]["long_range_led"]["glyph_xor"]
    assert summary["small"] == [99.0, 100.0] and summary["large"] == [99.5, 98.8]  # seed 0 fresh, seed 1 kept


@pytest.mark.parametrize(("contents", "message"), [
    ("{not json", "is not a probe_suite.py record"),
    ('{"runs": []}', "no command, machine, epochs, eval_images"),
    (None, "No such file"),
])
def test_a_file_that_is_no_record_is_refused_in_one_line(suite, tmp_path, capsys, contents, message):
    earlier = tmp_path / "earlier.json"
    if contents is not None:
        earlier.write_text(contents)
    with pytest.raises(SystemExit) as exit_:
        suite.main(["--table-only", "--keep", str(earlier), "--out", str(tmp_path / "designs")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error and "Traceback" not in error


def test_a_record_of_another_design_or_budget_is_refused(suite, tmp_path, capsys):
    foreign = _record(tmp_path / "foreign.json", [("someone_elses", "glyph_xor", 0, 90.0, 80.0)])
    longer = _record(tmp_path / "longer.json", [("long_range", "glyph_xor", 0, 90.0, 80.0)], epochs=24)
    with pytest.raises(SystemExit):
        suite.main(["--table-only", "--runs", str(tmp_path), "--keep", str(foreign), "--out", str(tmp_path / "d")])
    assert "a run it names is not this script's" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        suite.main(["--table-only", "--runs", str(tmp_path), "--keep", str(longer), "--out", str(tmp_path / "d")])
    assert "holds runs with epochs=24, these have 12" in capsys.readouterr().err
    assert not (tmp_path / "d.json").exists()
