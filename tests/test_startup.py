"""Start-up: ``import weightformer`` leaves the optional heavy packages alone and still
registers the models with timm, and the ``weightformer`` command answers ``--help`` (its own and every
subcommand's) and a mistake without importing torch, then imports what a real command needs.

Each check runs in a fresh interpreter, started as a user starts it: ``python -c``, the console script
(a file named ``weightformer`` holding what pip writes for ``weightformer = weightformer.cli:main``) and
``python -m weightformer``. No timing here: ``weightformer --help``'s time is measured by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image

from weightformer.engine.registry import get_task
from weightformer.tasks import BUILTIN_TASKS

# What --help and a bad flag must not import, and what importing the package must not import.
HEAVY = ("torch", "timm", "torchvision", "diffusers", "matplotlib", "onnx", "onnxruntime", "pycocotools")
OPTIONAL = ("diffusers", "matplotlib", "onnx", "onnxruntime", "pycocotools")

# pip's console-script template for ``weightformer = weightformer.cli:main``, with a loop over argument
# lists instead of one run: for each, the exit code and the heavy packages imported so far.
DRIVER = textwrap.dedent("""\
    import re
    import sys
    from weightformer.cli import main
    if __name__ == '__main__':
        sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
        import json
        runs, heavy, out = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
        results = []
        for argv in runs:
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's --help
                code = exc.code
            results.append([argv, code, sorted(m for m in heavy if m in sys.modules)])
        with open(out, "w") as f:
            json.dump(results, f)
""")


def _python(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _imported(stderr: str) -> set[str]:
    """The top-level packages ``python -X importtime`` reports as imported."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def _help_and_mistakes() -> list[list[str]]:
    """--help of the command, of every task, task subcommand and tool; and mistakes of each kind."""
    runs = [["--help"], [], ["train", "--help"], ["eval", "--help"], ["predict", "--help"]]
    for name, (_, cli) in BUILTIN_TASKS.items():
        runs += [[cli, "--help"], [cli, "train", "--help"]]
        runs += [[cli, command.name, "--help"] for command in get_task(name).cli.commands]
    runs += [["bench", "--help"], ["export", "--help"], ["ablate", "--help"], ["analyze", "--help"],
             ["analyze", "erf", "--help"], ["analyze", "updates", "--help"], ["analyze", "interaction", "--help"],
             ["data", "--help"], ["data", "pack", "--help"], ["data", "verify", "--help"]]
    mistakes = [["train", "--no-such-flag"], ["det", "train", "--epochs", "many"], ["trian"], ["gen", "smaple"],
                ["seg", "eval"], ["export", "--no-such-flag"], ["bench", "--no-such-flag"], ["analyze", "erf", "--bad"],
                ["data", "pack", "mnist"], ["data", "verify", "--bad"]]
    return runs + mistakes


def test_import_registers_the_models_and_leaves_optional_packages_alone(tmp_path):
    code = (f"import json, sys; import weightformer; optional = {OPTIONAL!r}; "
            "print(json.dumps(sorted(m for m in optional if m in sys.modules))); "
            "import timm; print(timm.is_model('weightformer_tiny'), timm.is_model('weightformer_small'), "
            "type(timm.create_model('weightformer_tiny', embed_dim=32, depth=2)).__name__, "
            "weightformer.WeightFormer.__name__)")
    done = _python("-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    imported, registered = done.stdout.splitlines()
    assert json.loads(imported) == []
    assert registered == "True True WeightFormer WeightFormer"


def test_console_script_answers_help_and_mistakes_without_torch(tmp_path):
    script = tmp_path / "weightformer"
    script.write_text(DRIVER)
    runs = _help_and_mistakes()
    out = tmp_path / "results.json"
    done = _python(str(script), json.dumps(runs), json.dumps(HEAVY), str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = json.loads(out.read_text())
    assert [r[0] for r in results] == runs
    for argv, code, heavy in results:
        assert heavy == [], f"weightformer {' '.join(argv)} imported {heavy}"
        if "--help" in argv:
            assert code == 0, f"weightformer {' '.join(argv)} exited {code}\n{done.stderr}"
        else:  # no arguments, a bad flag or value, a typo'd subcommand, a missing required flag
            assert code == 2, f"weightformer {' '.join(argv)} exited {code}\n{done.stderr}"


def test_console_script_registers_the_models_once_a_command_runs(tmp_path):
    """The command's package import leaves the models out; a real command still finds them in timm
    (``predict`` rebuilds a weightformer_tiny from a checkpoint's meta)."""
    kwargs = {"patch_size": 4, "embed_dim": 32, "depth": 2, "img_size": 32}
    model = timm.create_model("weightformer_tiny", num_classes=2, **kwargs)
    meta = {"task": "classification", "model": "weightformer_tiny", "model_kwargs": kwargs, "num_classes": 2,
            "in_chans": 3, "img_size": 32, "data": "two", "classes": ["a", "b"], "mean": [0.5] * 3,
            "std": [0.25] * 3, "interpolation": "bilinear", "crop_pct": 1.0, "crop_mode": "center"}
    torch.save({"model": model.state_dict(), "meta": meta}, tmp_path / "best.pt")
    Image.new("RGB", (32, 32), (200, 10, 10)).save(tmp_path / "red.png")
    script = tmp_path / "weightformer"
    script.write_text(DRIVER)
    runs = [["predict", "--help"], ["predict", "red.png", "--checkpoint", "best.pt"]]
    out = tmp_path / "results.json"
    done = _python(str(script), json.dumps(runs), json.dumps(["torch"]), str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (_, help_code, before), (_, code, after) = json.loads(out.read_text())
    assert (help_code, before) == (0, [])
    assert (code, after) == (0, ["torch"]), done.stderr
    assert done.stdout.splitlines()[-1].startswith("red.png: "), done.stdout


@pytest.mark.parametrize("argv", [["--help"], ["det", "train", "--help"], ["gen", "sample", "--help"],
                                  ["train", "--no-such-flag"]])
def test_python_m_answers_without_torch(tmp_path, argv):
    done = _python("-X", "importtime", "-m", "weightformer", *argv, cwd=tmp_path)
    assert done.returncode == (0 if "--help" in argv else 2), done.stderr[-2000:]
    assert "weightformer" in _imported(done.stderr)  # the report lists the package: the check can see it
    assert not _imported(done.stderr) & set(HEAVY), f"python -m weightformer {' '.join(argv)}"
