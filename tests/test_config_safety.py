"""Settings are data, safely read: every YAML a user gives (a --config file and its _base_ files, --set,
--model-kwargs, an ablation grid) goes through one loader that refuses duplicate keys and aliases that
expand without bound; an error line stays short whatever the input; and the command line gives a setting
one value, over the --config file, over the recipe."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import yaml

import weightformer.engine.loop  # noqa: F401 (imported before the memory of a run is measured)
import weightformer.models  # noqa: F401
from weightformer.classification.task import ClassificationTask
from weightformer.cli import main
from weightformer.engine import ConfigError, prepare_config
from weightformer.engine.cli import MAX_LINE, build_parser, train_overrides
from weightformer.engine.config import load_yaml, read_yaml_tree

RUN = ["--max-steps", "1", "--device", "cpu", "--workers", "0", "--batch-size", "4"]


def _laughs(levels: int) -> str:
    """A "billion laughs" flow list: level i holds nine aliases of level i - 1, so it expands to 9**(levels+1)
    strings in a few hundred bytes."""
    anchors = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    anchors += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "[" + ", ".join(anchors) + "]"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err[:2000]
    assert len(err) <= len("error: \n") + MAX_LINE, len(err)
    return err


def _train(capsys, *argv: str) -> tuple[int, str]:
    """``weightformer train ARGV`` -> (exit code, its one error line); the peak of Python's memory stays small."""
    tracemalloc.start()
    try:
        code = main(["train", *argv])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB"
    return code, _error_line(capsys)


@pytest.mark.parametrize("levels", [4, 8])  # 59,049 strings (a 400 kB message); 387 million (no memory holds them)
@pytest.mark.parametrize("where", ["--config", "--set", "--model-kwargs"])
def test_billion_laughs_are_one_short_line(where: str, levels: int, tmp_path: Path, capsys):
    bomb = _laughs(levels)
    config = tmp_path / "bomb.yaml"
    config.write_text(f"model_kwargs: {{x: {bomb}}}\n")
    argv = {"--config": ["--config", str(config)], "--set": ["--set", f"model_kwargs={{x: {bomb}}}"],
            "--model-kwargs": ["--model-kwargs", f"x={bomb}"]}[where]
    code, line = _train(capsys, *argv, "--output", str(tmp_path / "run"), *RUN)
    assert code == 2 and "its aliases (*name) expand it by more than 100,000 characters" in line
    assert not (tmp_path / "run").exists()


def test_an_alias_anywhere_is_bounded(tmp_path: Path, capsys):
    """In a _base_ file, an ablation grid, --set; an alias inside its own anchor; nesting too deep to read."""
    (tmp_path / "base.yaml").write_text(f"model_kwargs: {{x: {_laughs(4)}}}\n")
    config = tmp_path / "run.yaml"
    config.write_text("_base_: base.yaml\nepochs: 1\n")
    code, line = _train(capsys, "--config", str(config), "--output", str(tmp_path / "run"), *RUN)
    assert code == 2 and f"_base_ of {config} {tmp_path / 'base.yaml'} is not valid YAML (its aliases" in line
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"output: {tmp_path / 'runs'}\nrecipe: {{data: 'glyph_match:size=32,train=16,val=8', epochs: 1, "
                    f"model_kwargs: {{x: {_laughs(4)}}}}}\nvariants: {{a: {{}}}}\n")
    assert main(["ablate", str(grid)]) == 2
    assert f"ablation config {grid} is not valid YAML (its aliases" in _error_line(capsys)
    code, line = _train(capsys, "--set", "model_kwargs={x: &a [*a]}", "--output", str(tmp_path / "run"), *RUN)
    assert code == 2 and "the value anchored at line 1 holds an alias to itself" in line
    config.write_text("model_kwargs: {x: " + "[" * 1000 + "]" * 1000 + "}\n")
    assert main(["train", "--config", str(config), "--output", str(tmp_path / "run"), *RUN]) == 2
    assert "is not valid YAML (its values are nested too deeply to read)" in _error_line(capsys)
    with pytest.raises(yaml.YAMLError, match="aliases"):  # the loader itself, before any value is built
        load_yaml(f"x: {_laughs(8)}")
    # aliases that stay small, and merge keys, are read as YAML says
    assert load_yaml("x: &b {epochs: 1, lr: 1e-3}\ny: {<<: *b, epochs: 2}\nz: [*b, *b]\n")["y"] == {"epochs": 2,
                                                                                                  "lr": 0.001}


def test_a_key_given_twice_is_refused_with_its_lines(tmp_path: Path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 1\nlr: 0.1\nepochs: 3\n")
    code, line = _train(capsys, "--config", str(config), "--output", str(tmp_path / "run"), *RUN)
    assert code == 2 and f"config file {config} is not valid YAML (the key 'epochs' is given twice, at lines 1 and 3" \
        in line
    (tmp_path / "base.yaml").write_text("model_kwargs:\n  depth: 2\n  depth: 3\n")
    config.write_text("_base_: base.yaml\n")
    with pytest.raises(ConfigError, match=r"_base_ of .* is not valid YAML \(the key 'depth' is given twice, at lines 2 and 3"):
        read_yaml_tree(config)
    code, line = _train(capsys, "--set", "model_kwargs={depth: 2, depth: 3}", "--output", str(tmp_path / "run"), *RUN)
    assert code == 2 and "the key 'depth' is given twice, at line 1, columns 2 and 12" in line
    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: {epochs: 1}\nvariants:\n  a: {}\n  b: {epochs: 2, epochs: 3}\n")
    assert main(["ablate", str(grid)]) == 2
    assert "the key 'epochs' is given twice, at line 4, columns 7 and 18" in _error_line(capsys)


@pytest.mark.parametrize("argv, problem, fix", [
    (["--set", "lr=" + "x" * 100_000], "setting 'lr' must be a number, got 'xxx", "xxx…"),
    (["--set", "x" * 100_000 + "=1"], "unknown setting 'xxx", "crop_pct, crop_mode"),
    (["--set", "model_kwargs={x: " + "y" * 100_000 + "}"], "does not take the model arguments {'patch_size'",
     "unexpected keyword argument 'x'; check --model-kwargs"),
    (["--epochs", "9" * 50_000 + "x" * 50_000], "argument --epochs: invalid int value: '999", "train --help)"),
    (["--set", "y" * 100_000], "--set 'yyy", "is not KEY=VALUE; write e.g. --set weight_decay=0.1"),
])
def test_a_huge_value_gives_a_short_line_that_keeps_the_fix(argv, problem, fix, tmp_path: Path, capsys):
    assert main(["train", *argv, "--output", str(tmp_path / "run"), *RUN]) == 2
    line = _error_line(capsys).rstrip("\n")
    assert line.startswith(f"error: {problem}") or problem in line[:100]
    assert line.endswith(fix) and "…" in line


@pytest.mark.parametrize("task", ["cls", "det", "seg", "gen"])
@pytest.mark.parametrize("argv, message", [
    (["--set", "data=mnist", "--data", "glyph_match"], "--data glyph_match and --set 'data=mnist' give 'data' two values"),
    (["--data", "glyph_match", "--set", "data=mnist"], "--data glyph_match and --set 'data=mnist' give 'data' two values"),
    (["--epochs", "1", "--set", "epochs=3"], "--epochs 1 and --set 'epochs=3' give 'epochs' two values; pass one"),
    (["--set", "epochs=3", "--ema", "--set", "ema=false"], "--ema and --set 'ema=false' give 'ema' two values"),
    (["--set", "lr=0.1", "--set", "lr=0.2"], "--set 'lr=0.1' and --set 'lr=0.2' give 'lr' two values"),
    (["--set", "model_kwargs={depth: 2}", "--model-kwargs", "depth=3"],
     "--set 'model_kwargs={depth: 2}' and --model-kwargs 'depth=3' give model_kwargs.depth two values"),
    (["--model-kwargs", "depth=2", "depth=3"], "--model-kwargs 'depth=2' and --model-kwargs 'depth=3' give 'depth' two"),
])
def test_one_setting_given_two_values_on_the_command_line_is_an_error(task, argv, message, tmp_path: Path, capsys):
    assert main([task, "train", *argv, "--output", str(tmp_path / "run"), *RUN]) == 2
    assert message in _error_line(capsys)


def _cli_settings(argv: list[str], tmp_path: Path):
    args = build_parser(ClassificationTask, "weightformer").parse_args(["train", *argv, "--output", str(tmp_path)])
    del args.command
    return prepare_config(train_overrides(args, ClassificationTask), getattr(args, "config_file", None),
                          task=ClassificationTask).cfg


def test_agreeing_values_are_one_and_the_command_line_wins_over_the_config_file(tmp_path: Path):
    cfg = _cli_settings(["--epochs", "3", "--set", "epochs=3", "--lr", "0.001", "--set", "lr=1e-3", "--ema",
                         "--set", "ema=true", "--set", "mixup=0.1", "--set", "mixup=0.1",
                         "--set", "model_kwargs={depth: 2}", "--model-kwargs", "depth=2", "embed_dim=32"], tmp_path)
    assert (cfg.epochs, cfg.lr, cfg.ema, cfg.mixup) == (3, 0.001, True, 0.1)
    assert cfg.model_kwargs["depth"] == 2 and cfg.model_kwargs["embed_dim"] == 32
    config = tmp_path / "run.yaml"
    config.write_text("data: glyph_match\nepochs: 7\nmixup: 0.5\nmodel_kwargs: {depth: 4, embed_dim: 64}\n")
    cfg = _cli_settings(["--config", str(config), "--epochs", "2", "--set", "mixup=0.2", "--model-kwargs", "depth=2",
                         "--data", "mnist"], tmp_path)
    assert (cfg.epochs, cfg.mixup, cfg.data) == (2, 0.2, "mnist")
    assert cfg.model_kwargs["depth"] == 2 and cfg.model_kwargs["embed_dim"] == 64
    assert (_cli_settings(["--config", str(config)], tmp_path).epochs, cfg.epochs) == (7, 2)  # the file over the recipe


@pytest.mark.parametrize("task", ["cls", "det", "seg", "gen"])
def test_the_train_help_states_the_order(task: str, capsys):
    with pytest.raises(SystemExit):
        main([task, "train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "the recipe (a resumed run's own settings instead), then --config FILE.yaml" in help_text
    assert "a flag and a --set giving it two values, or two --set, is an error" in help_text
