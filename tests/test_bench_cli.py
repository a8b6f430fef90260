"""``weightformer bench`` options: every bad setting is one error line before any work; help; output checks.

No test here measures anything: ``Sweep.run`` is replaced wherever a run could start.
"""

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from weightformer.bench import cli as bench_cli
from weightformer.bench.sweep import Sweep, SweepConfig
from weightformer.cli import main

NO_CUDA = not torch.cuda.is_available()
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_sweep(monkeypatch):
    """Fail the test if a sweep starts."""

    def refuse(self):
        raise AssertionError("the sweep started although a setting was bad")

    monkeypatch.setattr(Sweep, "run", refuse)


def _bench_error(capsys, *argv: str) -> str:
    """Run ``weightformer bench ARGV``; assert status 2 and one ``error:`` line on stderr; return it."""
    try:
        code = main(["bench", *argv])
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    assert code == 2, (code, out, err)
    assert out == "", out
    err = err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--device", "foo"], "choose from cpu, cuda, cuda:N"),
        (["--resolutions", "0"], "multiple of 16"),
        (["--resolutions", "-224"], "multiple of 16"),
        (["--resolutions", "230"], "multiple of 16"),
        (["--resolutions", "x"], "expected an integer"),
        (["--resolutions", ","], "such as 224,448"),
        (["--train-resolutions", "0"], "multiple of 16"),
        (["--memory-resolutions", "abc"], "expected an integer"),
        (["--batch", "0"], "below 1"),
        (["--batch", "224:0,1"], "below 1"),
        (["--batch", "224:-4"], "below 1"),
        (["--batch", "x"], "bad batch entry 'x'"),
        (["--batch", "2,4"], "give one"),
        (["--batch", "100:4"], "multiple of 16"),
        (["--models", "resnet"], "choose from wf-t"),
        (["--models", ","], "no models given; choose from wf-t"),
        (["--measure", "speed"], "choose from infer, train, memory, flops"),
        (["--memory-modes", "both"], "choose from infer, train"),
        (["--dtype", "int8"], "choose from 'float32', 'bfloat16', 'float16'"),
        (["--repetitions", "0"], ">= 1"),
        (["--repetitions", "-1"], ">= 1"),
        (["--repetitions", "2.5"], "expected an integer"),
        (["--min-rep-seconds", "-1"], ">= 0"),
        (["--min-rep-seconds", "x"], "expected a number"),
        (["--max-call-seconds", "0"], "> 0"),
        (["--max-call-seconds", "nan"], "> 0"),
        (["--max-call-seconds", "inf"], "> 0"),
        (["--threads", "0"], ">= 1"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_setting_is_one_error_line_before_any_work(capsys, no_sweep, argv, expected):
    assert expected in _bench_error(capsys, *argv)


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_is_a_user_error(capsys, no_sweep):
    assert "no CUDA GPU is visible" in _bench_error(capsys, "--device", "cuda")
    assert "no CUDA GPU is visible" in _bench_error(capsys, "--device", "cuda:1")


@pytest.mark.parametrize("config", [dict(resolutions=[0]), dict(default_batch=0), dict(batch_sizes={224: 0}),
                                    dict(device="foo"), dict(dtype="int8"), dict(max_call_seconds=-1.0),
                                    dict(measurements=()), dict(memory_modes=("both",)), dict(threads=0)])
def test_sweep_config_refuses_bad_settings(config):
    with pytest.raises(ValueError):
        SweepConfig(**{"models": ["wf-t"], "resolutions": [224], **config})


def test_bad_setting_exits_2_from_the_real_command(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "weightformer", "bench", "--device", "foo", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: argument --device: unknown device 'foo'")
    assert len(proc.stderr.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["file", "below-a-file", "proc", "output-is-a-folder"])
def test_unusable_out_is_refused_before_the_sweep(tmp_path, capsys, no_sweep, where):
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    out = {
        "file": a_file,
        "below-a-file": a_file / "cpu",
        "proc": Path("/proc/weightformer-bench-out"),
        "output-is-a-folder": tmp_path / "out",
    }[where]
    if where == "output-is-a-folder":
        (out / "results.json").mkdir(parents=True)
    err = _bench_error(capsys, "--models", "wf-t", "--resolutions", "32", "--out", str(out))
    assert f"--out {out}" in err


def test_help_has_text_and_default_for_every_option_and_names_the_duration(capsys):
    parser = argparse.ArgumentParser(prog="weightformer bench")
    bench_cli.add_arguments(parser)
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{action.option_strings} has no help text"
        if not isinstance(action, argparse._StoreTrueAction):
            assert "default:" in action.help, f"{action.option_strings} does not show its default"
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--help"])
    assert exit.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "A bare `weightformer bench` runs the full sweep" in text and "minutes" in text
    assert "--quick" in text and "(default: 224,448,624,896,1248,2048)" in text and "(default: 3)" in text


def test_quick_is_a_small_sweep_and_explicit_flags_win():
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    quick = bench_cli.config_from_args(parser.parse_args(["--quick", "--device", "cpu"]))
    assert (quick.models, quick.resolutions, quick.measurements) == (["wf-t", "deit-t"], [224, 448], ("infer", "flops"))
    mixed = bench_cli.config_from_args(parser.parse_args(["--quick", "--resolutions", "32", "--device", "cpu"]))
    assert mixed.resolutions == [32] and mixed.models == ["wf-t", "deit-t"]
    full = bench_cli.config_from_args(parser.parse_args(["--device", "cpu"]))
    assert full.models == bench_cli.DEFAULT_MODELS and full.resolutions == bench_cli.DEFAULT_RESOLUTIONS


def _fake_result(config):
    row = {"model": "wf-t", "label": "WeightFormer-T", "baseline_model": "deit-t", "resolution": 32, "batch": 1,
           "measurement": "infer_throughput", "status": "ok", "value": 12.5, "unit": "img/s", "ratio_vs_baseline": None,
           "samples_s": [0.08], "reason": ""}
    machine = {"gpu": None, "cpu": "test cpu", "cpu_affinity": 1, "cpu_count": 1, "torch": "x", "torch_threads": 1,
               "date": "2026-01-01"}
    return {"machine": machine, "config": {"dtype": "float32"}, "elapsed_s": 1.0, "points_measured": 1,
            "points_reused": 0, "rows": [row], "flops": []}


def test_results_are_printed_before_they_are_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Sweep, "run", lambda self: _fake_result(self.config))

    def disk_full(result, out):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bench_cli, "write_all", disk_full)
    with pytest.raises(OSError):
        main(["bench", "--models", "wf-t", "--resolutions", "32", "--device", "cpu", "--out", str(tmp_path)])
    assert "| WeightFormer-T |" in capsys.readouterr().out


def test_sigterm_stops_the_sweep_with_143_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    threads = torch.get_num_threads()

    def killed_run(self):
        torch.set_num_threads(1)
        # Without a handler of the sweep's own, SIGTERM would end pytest itself.
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, before), "the sweep does not handle SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # interrupted by the signal
        raise AssertionError("SIGTERM did not stop the sweep")

    monkeypatch.setattr(Sweep, "_run", killed_run)
    before = signal.getsignal(signal.SIGTERM)
    code = main(["bench", "--models", "wf-t", "--resolutions", "32", "--device", "cpu", "--threads", "1",
                 "--out", str(tmp_path)])
    assert code == 143
    err = capsys.readouterr().err
    assert "stopped by SIGTERM" in err and "--resume" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
    assert torch.get_num_threads() == threads  # and so is the thread count
    header = json.loads((tmp_path / "points.jsonl").read_text().splitlines()[0])
    assert header["settings"]["threads"] == 1


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_targets_script_checks_its_output_before_measuring(tmp_path, capsys, monkeypatch):
    targets = _script("targets")
    monkeypatch.setattr(targets, "inference_targets", lambda *a: pytest.fail("measured before checking --out"))
    (tmp_path / "targets_cpu.json").mkdir()
    assert targets.main(["--out", str(tmp_path / "targets_cpu.json")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: --out ") and "cannot be replaced by a file" in err and len(err.splitlines()) == 1


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
def test_gpu_script_without_cuda_is_an_error_on_stderr(capsys):
    assert _script("gpu").main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: benchmarks/gpu.py needs a CUDA GPU")
