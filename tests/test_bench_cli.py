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
from weightformer.bench import sweep
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
        (["--device", "foo"], "--device must be auto, cuda, cuda:N or cpu, got 'foo'"),
        (["--device", "cuda:x"], "--device must be auto, cuda, cuda:N or cpu"),
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
        (["--dtype", "int8"], "unknown dtypes 'int8'; choose from float32, bfloat16, float16"),
            (["--runtime", "jit"], "unknown runtimes 'jit'; choose from eager, compile"),
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
                                    dict(device="foo"), dict(dtypes=("int8",)), dict(runtimes=("jit",)), dict(max_call_seconds=-1.0),
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
    assert proc.stderr.startswith("error: --device must be auto, cuda, cuda:N or cpu, got 'foo'")
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
    row = {"model": "wf-t", "label": "WeightFormer-T", "subject": "wf-t", "runtime": "eager", "dtype": "float32",
           "baseline_model": "deit-t", "resolution": 32, "batch": 1,
           "measurement": "infer_throughput", "status": "ok", "value": 12.5, "unit": "img/s", "ratio_vs_baseline": None,
           "samples_s": [0.08], "reason": ""}
    machine = {"gpu": None, "cpu": "test cpu", "cpu_affinity": 1, "cpu_count": 1, "torch": "x", "torch_threads": 1,
               "date": "2026-01-01"}
    return {"machine": machine, "config": {"dtypes": ["float32"], "device": config.device}, "elapsed_s": 1.0, "points_measured": 1,
            "points_reused": 0, "rows": [row], "flops": []}


def test_results_are_printed_before_they_are_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Sweep, "run", lambda self: _fake_result(self.config))

    def disk_full(result, out):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sweep, "write_all", disk_full)
    assert main(["bench", "--models", "wf-t", "--resolutions", "32", "--device", "cpu", "--out", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "| WeightFormer-T |" in out and "no space left on the device" in err


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
    assert err.startswith("error: --out ") and "is a folder" in err and len(err.splitlines()) == 1


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
def test_gpu_script_without_cuda_is_an_error_on_stderr(capsys):
    assert _script("gpu").main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: benchmarks/gpu.py needs a CUDA GPU")


# -------------------------------------------------------------------------------------------------
# One rule for the three bench commands (the sweep, `bench dense`, `bench dit`): an --out that holds a
# command's results is refused unasked and before the work, --overwrite moves them aside (never deletes);
# every number flag is finite and in range; --device cuda without a GPU is one line.
# -------------------------------------------------------------------------------------------------
from weightformer.bench import dense, dit  # noqa: E402
from weightformer.bench.results import machine_info  # noqa: E402

# command -> (argv before the flags, the files it writes, its default folder under benchmarks/results, tiny flags)
BENCH = {
    "sweep": ([], ("results.json", "results.csv", "results.md", "scaling.png", "points.jsonl"), "cpu",
              ["--models", "wf-t", "--resolutions", "32", "--device", "cpu"]),
    "dense": (["dense"], ("results.json", "results.md"), "cpu/dense",
              ["--models", "wf-t", "--sizes", "32", "--modes", "infer", "--no-memory", "--device", "cpu"]),
    "dit": (["dit"], ("dit.json", "dit.md"), "cpu/dit",
            ["--models", "wf_dit_s_8", "dit_s_8", "--sides", "8", "--repeats", "1", "--no-memory", "--device", "cpu"]),
}


def _no_work(monkeypatch, command: str) -> None:
    """Fail the test if the command's measurements start."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"bench {command} started measuring although it should have refused")

    target = {"sweep": (Sweep, "run"), "dense": (dense, "run"), "dit": (dit, "benchmark")}[command]
    monkeypatch.setattr(*target, refuse)


def _fake_work(monkeypatch, command: str) -> None:
    """Replace the command's measurements with an instant, empty (or one-row) result."""
    if command == "sweep":
        monkeypatch.setattr(Sweep, "run", lambda self: _fake_result(self.config))
    elif command == "dense":
        monkeypatch.setattr(dense, "run", lambda config, log=print: {
            "machine": machine_info("cpu"), "settings": {"modes": list(config.modes), "sizes": []}, "rows": [],
            "elapsed_s": 0.0})
    else:
        def benchmark(*args, on_side=None, **kwargs):
            on_side([])
            return []

        monkeypatch.setattr(dit, "benchmark", benchmark)


def _bench(command: str, *argv: str) -> list:
    """The arguments after ``weightformer bench`` of a tiny run of ``command``."""
    prefix, _, _, tiny = BENCH[command]
    return [*prefix, *tiny, *argv]


@pytest.mark.parametrize("held", ["all", "one"])
@pytest.mark.parametrize("command", list(BENCH))
def test_the_default_out_holding_earlier_results_is_refused_before_the_work(command, held, tmp_path, monkeypatch,
                                                                            capsys):
    """The default --out holds the committed results: every bench command refuses to replace them unasked."""
    _, names, default, _ = BENCH[command]
    monkeypatch.chdir(tmp_path)
    _no_work(monkeypatch, command)
    folder = tmp_path / "benchmarks" / "results" / default
    folder.mkdir(parents=True)
    for name in names if held == "all" else names[-1:]:
        (folder / name).write_text(f"earlier {name}")
    before = sorted(p.name for p in folder.iterdir())
    err = _bench_error(capsys, *_bench(command))  # no --out: the default folder
    assert "already holds" in err and "--overwrite" in err and str(Path("benchmarks/results") / default) in err
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing moved, nothing written
    assert all((folder / n).read_text() == f"earlier {n}" for n in before)


@pytest.mark.parametrize("command", list(BENCH))
def test_overwrite_moves_earlier_results_aside_and_touches_nothing_else(command, tmp_path, monkeypatch, capsys):
    _, names, _, _ = BENCH[command]
    out = tmp_path / "out"
    (out / "other-suite").mkdir(parents=True)
    (out / "other-suite" / "results.json").write_text("another suite's")
    (out / "profile.txt").write_text("a profile")
    for name in names:
        (out / name).write_text(f"earlier {name}")
    _fake_work(monkeypatch, command)
    assert main(["bench", *_bench(command, "--out", str(out), "--overwrite")]) == 0
    assert "moved aside" in capsys.readouterr().out
    for name in names:
        aside = list(out.glob(f"{name}.previous-*"))
        assert len(aside) == 1 and aside[0].read_text() == f"earlier {name}", name  # kept, never deleted
    written = [n for n in names if n != "points.jsonl"]  # the fake sweep writes no journal
    assert all((out / n).exists() and (out / n).read_bytes() != f"earlier {n}".encode() for n in written)
    assert (out / "other-suite" / "results.json").read_text() == "another suite's"
    assert (out / "profile.txt").read_text() == "a profile"


@pytest.mark.parametrize("command", list(BENCH))
def test_an_out_holding_none_of_the_commands_files_is_used_as_it_is(command, tmp_path, monkeypatch):
    _, names, _, _ = BENCH[command]
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _fake_work(monkeypatch, command)
    assert main(["bench", *_bench(command, "--out", str(out))]) == 0
    assert (out / "notes.txt").read_text() == "mine" and not list(out.glob("*.previous-*"))


@pytest.mark.parametrize("where", ["proc", "file", "below-a-file", "output-is-a-folder"])
@pytest.mark.parametrize("command", list(BENCH))
def test_an_unusable_out_is_one_line_before_the_work(command, where, tmp_path, monkeypatch, capsys):
    """`bench dit --out /proc/x` (and every bench command's) is checked before the work, in one line."""
    _, names, _, _ = BENCH[command]
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    out = {"proc": Path("/proc/weightformer-bench-out"), "file": a_file, "below-a-file": a_file / "sub",
           "output-is-a-folder": tmp_path / "out"}[where]
    if where == "output-is-a-folder":
        (out / names[0]).mkdir(parents=True)
    _no_work(monkeypatch, command)
    assert f"--out {out}" in _bench_error(capsys, *_bench(command, "--out", str(out)))


@pytest.mark.parametrize("command, flag, value", [
    ("dit", "--max-seconds", "nan"), ("dit", "--max-seconds", "inf"), ("dit", "--max-seconds", "-inf"),
    ("dit", "--max-seconds", "0"), ("dit", "--max-seconds", "-1"), ("dit", "--max-seconds", "x"),
    ("dit", "--sides", "0"), ("dit", "--sides", "-8"), ("dit", "--sides", "nan"), ("dit", "--sides", "8.5"),
    ("dit", "--batch", "0"), ("dit", "--batch", "inf"), ("dit", "--repeats", "0"), ("dit", "--repeats", "nan"),
    ("dense", "--max-call-seconds", "nan"), ("dense", "--max-call-seconds", "inf"),
    ("dense", "--max-call-seconds", "0"),
    ("dense", "--repetitions", "0"), ("dense", "--repetitions", "inf"), ("dense", "--repetitions", "1.5"),
    ("sweep", "--min-rep-seconds", "nan"), ("sweep", "--min-rep-seconds", "inf"), ("sweep", "--repetitions", "inf"),
    ("sweep", "--threads", "nan"), ("sweep", "--max-call-seconds", "-inf"),
])
def test_every_number_flag_refuses_non_finite_and_out_of_range_values(command, flag, value, tmp_path, monkeypatch,
                                                                       capsys):
    """`bench dit --max-seconds nan` is refused in one line, not accepted to cut every point off."""
    _no_work(monkeypatch, command)
    err = _bench_error(capsys, *_bench(command, f"{flag}={value}", "--out", str(tmp_path / "out")))  # = for -inf
    assert flag in err and value in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, message", [
    (["--models", "wf_dit_s_8", "wf_dit_s_8"], "names wf_dit_s_8 twice"),
    (["--models", "wf_dit_s_8", "dit_s_8", "--sides", "12"], "multiples of the models' patch sizes (8), got [12]"),
])
def test_dit_settings_that_cannot_be_compared_are_one_line(argv, message, tmp_path, monkeypatch, capsys):
    _no_work(monkeypatch, "dit")
    err = _bench_error(capsys, "dit", *argv, "--out", str(tmp_path / "out"))
    assert message in err and not (tmp_path / "out").exists()


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
@pytest.mark.parametrize("command", list(BENCH))
def test_cuda_without_a_gpu_is_one_line_in_every_bench_command(command, device, tmp_path, monkeypatch, capsys):
    """`--device cuda` without a GPU is one line in every bench command, not a traceback."""
    _no_work(monkeypatch, command)
    err = _bench_error(capsys, *_bench(command, "--device", device, "--out", str(tmp_path / "out")))
    assert err.startswith(f"error: --device {device}: no CUDA GPU is visible here")
    assert not (tmp_path / "out").exists()  # the device is checked before the output folder is made


def test_auto_device_is_recorded_as_the_device_it_picked():
    from weightformer.bench.checks import check_device

    assert check_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert SweepConfig(models=["wf-t"], resolutions=[224], device="auto").device == check_device("auto")
    assert dense.DenseBenchConfig(device="auto").device == check_device("auto")
    with pytest.raises(ValueError, match="max_call_seconds"):
        dense.DenseBenchConfig(max_call_seconds=float("nan"))


def test_resume_needs_the_journal_it_continues(tmp_path, monkeypatch, capsys):
    """--resume continues points.jsonl in place; without one there the earlier results are not its to
    replace; --resume with --overwrite is a contradiction."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("earlier")
    _no_work(monkeypatch, "sweep")
    err = _bench_error(capsys, *_bench("sweep", "--out", str(out), "--resume"))
    assert "already holds results.json" in err and "no points.jsonl there to resume from" in err
    err = _bench_error(capsys, *_bench("sweep", "--out", str(out), "--resume", "--overwrite"))
    assert "pass one of them" in err
    assert [p.name for p in out.iterdir()] == ["results.json"]
    (out / "points.jsonl").write_text("a journal\n")  # there: the sweep continues it (the journal checks it)
    _fake_work(monkeypatch, "sweep")
    assert main(["bench", *_bench("sweep", "--out", str(out), "--resume")]) == 0
    assert (out / "points.jsonl").read_text() == "a journal\n" and not list(out.glob("*.previous-*"))


@pytest.mark.parametrize("command", ["dense", "dit"])
def test_a_run_that_fails_before_writing_leaves_no_empty_folder(command, tmp_path, monkeypatch, capsys):
    def fail(*args, **kwargs):
        raise RuntimeError("a failure inside the measurements")

    monkeypatch.setattr(*{"dense": (dense, "run"), "dit": (dit, "benchmark")}[command], fail)
    out = tmp_path / "new" / "folder"
    assert main(["bench", *_bench(command, "--out", str(out))]) == 1
    assert "a failure inside the measurements" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="mallopt is glibc's")
@pytest.mark.parametrize("allocator", ["cached", "system"])
def test_every_suite_times_under_the_allocator_policy_and_says_which(allocator, tmp_path):
    """--allocator is one flag of every suite (the sweep's, dense's, dit's, export's), applied before any timing
    and written on the machine line; a fresh process each, since the policy lasts for the process."""
    from weightformer.bench.cli import SUITES

    out = tmp_path / "dense"
    run = subprocess.run([sys.executable, "-m", "weightformer", "bench", *_bench("dense"), "--out", str(out),
                          "--allocator", allocator, "--repetitions", "1"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    said = {"cached": "keeps freed memory", "system": "system"}[allocator]
    assert json.loads((out / "results.json").read_text())["machine"]["allocator"] == said
    assert f"malloc {said};" in (out / "results.md").read_text()
    for suite in ("dit", "export"):
        parsed = SUITES[suite][2]().parse_args(["--allocator", allocator])
        assert parsed.allocator == allocator
