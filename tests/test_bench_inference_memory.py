"""The sweep measures inference memory at every point (each model in a fresh process), its table says how,
every table names the machine, load and command, benchmarks/targets.py reports the 1248² inference-memory
ratios, and `weightformer bench --help`, each suite's `--help` and a bad flag import no torch."""

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from weightformer.bench.cli import add_arguments, config_from_args
from weightformer.bench.results import command_line, describe, machine_info
from weightformer.bench.sweep import Sweep, SweepConfig, markdown_table

REPO = Path(__file__).resolve().parents[1]


def test_inference_memory_is_measured_and_filled_at_every_point():
    """The default measurements include inference memory: every inference-memory cell is filled, none "—"."""
    models, resolutions = ["wf-t", "deit-t-explicit"], [32, 48]
    config = SweepConfig(models=models, resolutions=resolutions, measurements=("infer", "memory"),
                         train_resolutions=[], repetitions=1, min_rep_seconds=0.0, threads=1)
    result = Sweep(config, log=lambda _: None, command="weightformer bench --made-up").run()
    memory = {(r["model"], r["resolution"]): r for r in result["rows"] if r["measurement"] == "infer_memory"}
    assert set(memory) == {(m, res) for m in models for res in resolutions}
    for row in memory.values():
        assert row["status"] == "ok" and row["unit"] == "MiB", row
        assert row["value"] == pytest.approx(row["peak_mib"] - row["baseline_mib"])
        assert "fresh subprocess" in row["method"] and row["baseline_mib"] > 0
    assert not [r for r in result["rows"] if r["measurement"] == "train_memory"]  # training is not timed here
    table = markdown_table(result)
    header = next(line for line in table.splitlines() if line.startswith("| Model"))
    assert "Inference memory (MiB, peak RSS)" in header
    assert "each model in a fresh process" in table and "VmHWM" in table
    rows = [line for line in table.splitlines() if line.startswith("| DeiT-T explicit")]
    assert len(rows) == len(resolutions) and all(row.split("|")[6].strip() not in ("—", "") for row in rows)
    assert "Command: `weightformer bench --made-up`" in table and "load average at start" in table


def test_the_cli_defaults_measure_memory_of_both_modes_where_they_are_timed():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--device", "cpu"]))
    assert config.memory_modes == ("infer", "train") and config.memory_resolutions is None
    for res in config.resolutions:  # inference memory everywhere, training memory where training is timed
        assert config.measures("memory", "infer", res)
        assert config.measures("memory", "train", res) == (res in config.train_resolutions)
    only = SweepConfig(models=["wf-t"], resolutions=[224, 448], memory_resolutions=[448])
    assert not only.measures("memory", "infer", 224) and only.measures("memory", "infer", 448)


def test_the_machine_line_names_threads_load_and_command():
    info = machine_info("cpu", command="weightformer bench --quick")
    assert len(info["load_average"]) == 3 and info["command"] == "weightformer bench --quick"
    line = describe(info)
    assert f"{info['torch_threads']} threads" in line and "load average at start" in line
    assert describe({**info, "load_average": None}).count("load average not recorded") == 1  # older results
    assert command_line(["/venv/bin/weightformer", "bench", "dit", "--sides", "2 4"]) == \
        "weightformer bench dit --sides '2 4'"


def _targets():
    spec = importlib.util.spec_from_file_location("bench_targets", REPO / "benchmarks" / "targets.py")
    targets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(targets)
    return targets


def _memory_row(model: str, resolution: int, extra: float, batch: int = 1, measurement: str = "infer_memory"):
    return {"model": model, "resolution": resolution, "batch": batch, "measurement": measurement, "status": "ok",
            "value": extra, "peak_mib": 800.0 + extra, "baseline_mib": 800.0, "method": "VmHWM (made up)"}


def test_targets_reports_the_inference_memory_ratios_of_a_results_file(tmp_path):
    targets = _targets()
    rows = [_memory_row("wf-t", 1248, 40.0), _memory_row("deit-t", 1248, 50.0),
            _memory_row("deit-t-explicit", 1248, 800.0),
            _memory_row("wf-t", 624, 1.0), _memory_row("deit-t", 1248, 1.0, batch=2),  # other points: ignored
            _memory_row("deit-t-explicit", 1248, 1.0, measurement="train_memory")]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"rows": rows}))
    found, reports = targets.measure_inference_memory(path)
    explicit, fused = found
    assert explicit["measured"] == pytest.approx(40 / 800) and explicit["threshold"] == 0.09 and explicit["met"]
    assert fused["measured"] == pytest.approx(40 / 50) and fused["threshold"] == 0.7 and not fused["met"]
    assert explicit["comparison"] == fused["comparison"] == "<="
    assert "WeightFormer-T 40 MiB, DeiT-T fused 50 MiB, DeiT-T explicit 800 MiB" in fused["detail"]
    assert str(path) in fused["detail"] and reports["deit-t"]["extra_mib"] == 50.0
    assert "NOT MET" in targets.format_table(found)


def test_targets_refuses_a_results_file_without_the_points_before_measuring(tmp_path, capsys):
    targets = _targets()
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"rows": [_memory_row("wf-t", 1248, 40.0)]}))
    assert targets.main(["--sweep-results", str(path), "--out", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "no 1248² batch-1 inference memory of deit-t, deit-t-explicit" in err
    assert not (tmp_path / "t.json").exists()


# A driver that starts as the `weightformer` command (whose package import leaves the models, and so torch,
# out) and reports whether torch or timm got imported by the bench command.
DRIVER = """
import sys
sys.argv[0] = "weightformer"
from weightformer.cli import main
try:
    main(["bench", *{argv!r}])
except SystemExit:
    pass
print("IMPORTED", "torch" in sys.modules, "timm" in sys.modules)
"""


@pytest.mark.parametrize("argv", [["--help"], ["dit", "--help"], ["dense", "--help"], ["export", "--help"],
                                  ["--no-such-flag"], ["dit", "--sides", "x"], ["dense", "--sizes", "x"],
                                  ["--resolutions", "230"]])
def test_bench_help_and_bad_flags_import_no_torch(argv):
    proc = subprocess.run([sys.executable, "-c", DRIVER.format(argv=argv)], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "IMPORTED False False", (proc.stdout, proc.stderr)
    assert "usage" in proc.stdout + proc.stderr or "error:" in proc.stderr
