"""Recipes are files: every shipped recipe under configs/<task>/ loads, inherits and validates against its
task's config, and the ``_base_`` loader merges in order, takes lists, and refuses a missing base, a cycle
and a non-mapping in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from weightformer.engine import ConfigError
from weightformer.engine.config import load_config_file, read_yaml_tree, resolve_config
from weightformer.engine.recipes import RECIPE_ROOT, load_recipe
from weightformer.tasks import BUILTIN_TASKS
from weightformer.engine.registry import get_task

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SHIPPED = sorted((task, path) for task in BUILTIN_TASKS for path in (CONFIGS / get_task(task).name).glob("*.yaml"))


def test_every_task_has_its_recipes_folder_and_lists_only_files_there():
    assert RECIPE_ROOT == CONFIGS
    for task in BUILTIN_TASKS:
        cls = get_task(task)
        listed = cls.recipes()
        assert listed and all(r.path is not None and r.path.parent == CONFIGS / cls.name for r in listed)


@pytest.mark.parametrize("task, path", SHIPPED, ids=[f"{t}/{p.name}" for t, p in SHIPPED])
def test_every_shipped_recipe_loads_inherits_and_validates(task: str, path: Path):
    cls = get_task(task)
    recipe = load_recipe(path)
    assert recipe.name and recipe.summary and "_base_" not in recipe.values and "recipe" not in recipe.values
    assert path.read_text().startswith("#")  # each file says where its values come from
    resolved = resolve_config(cls.config_class, recipe.values).to_dict()  # every key a field, every value valid
    assert {k: resolved[k] for k in recipe.values} == dict(recipe.values)
    assert load_config_file(path, cls.config_class) == dict(recipe.values)  # --config takes it as well


def test_inheriting_recipes_take_their_bases_values():
    classification = CONFIGS / "classification"
    t, b = load_recipe(classification / "imagenet_weightformer_t.yaml"), load_recipe(classification / "imagenet_weightformer_b.yaml")
    assert (b.values["model"], b.values["img_size"], b.values["amp"]) == ("weightformer_base", 448, "none")
    assert b.values["model_kwargs"] == {**t.values["model_kwargs"], "drop_path_rate": 0.2}  # from S, over T's
    assert {k: b.values[k] for k in ("epochs", "lr", "mixup")} == {k: t.values[k] for k in ("epochs", "lr", "mixup")}
    assert b.name == "imagenet-b" and t.name == "imagenet"  # a base's name is not inherited


def _write(folder: Path, name: str, text: str) -> Path:
    (folder / name).write_text(text)
    return folder / name


def test_bases_merge_in_order_with_lists_and_nested_mappings(tmp_path: Path):
    _write(tmp_path, "a.yaml", "epochs: 1\nlr: 0.1\nmodel_kwargs: {depth: 2, embed_dim: 8}\ndecay_milestones: [1, 2]\n")
    _write(tmp_path, "b.yaml", "_base_: a.yaml\nepochs: 2\nmodel_kwargs: {depth: 3}\n")
    replaced = _write(tmp_path, "replaced.yaml", "_base_: a.yaml\nmodel_kwargs: {_delete_: true, depth: 5}\n")
    assert read_yaml_tree(replaced)["model_kwargs"] == {"depth": 5}
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub", "c.yaml", "lr: 0.3\ndecay_milestones: [5]\n")
    top = _write(tmp_path, "top.yaml", "_base_: [b.yaml, sub/c.yaml]\nbatch_size: 4\n")
    assert read_yaml_tree(top) == {"epochs": 2, "lr": 0.3, "model_kwargs": {"depth": 3, "embed_dim": 8},
                                   "decay_milestones": [5], "batch_size": 4}
    over = _write(tmp_path, "over.yaml", "_base_: top.yaml\nlr: 0.5\n")  # the file wins over every base
    assert read_yaml_tree(over)["lr"] == 0.5


@pytest.mark.parametrize("files, message", [
    ({"top.yaml": "_base_: nowhere.yaml\n"}, r"_base_ of .*top.yaml .*nowhere.yaml does not exist"),
    ({"top.yaml": "_base_: b.yaml\n", "b.yaml": "_base_: top.yaml\n"}, r"cycle \(top.yaml -> b.yaml -> top.yaml\)"),
    ({"top.yaml": "_base_: top.yaml\n"}, r"cycle \(top.yaml -> top.yaml\)"),
    ({"top.yaml": "_base_: b.yaml\n", "b.yaml": "- a list\n"}, r"b.yaml must hold a mapping of settings, got list"),
    ({"top.yaml": "_base_: {a: 1}\n"}, r"_base_ must be a file name or a list of them"),
    ({"top.yaml": "_base_: b.yaml\n", "b.yaml": "epochs: [\n"}, r"b.yaml is not valid YAML"),
])
def test_a_bad_base_is_one_line(tmp_path: Path, files: dict, message: str):
    for name, text in files.items():
        _write(tmp_path, name, text)
    with pytest.raises(ConfigError, match=message) as error:
        read_yaml_tree(tmp_path / "top.yaml")
    assert "\n" not in str(error.value)


def test_a_recipe_file_names_itself_and_a_config_file_need_not(tmp_path: Path):
    plain = _write(tmp_path, "run.yaml", "_base_: " + str(CONFIGS / "detection" / "shapes.yaml") + "\nepochs: 3\n")
    assert load_config_file(plain)["epochs"] == 3 and load_config_file(plain)["det_protocol"] == "torchvision"
    with pytest.raises(ConfigError, match="needs `recipe: {name: ..., summary: ...}`"):
        load_recipe(plain)


def test_the_runs_first_line_names_the_recipe_file():
    line = get_task("detection").choose_recipe("shapes", {}).line()
    assert line.startswith("recipe offline: ") and line.endswith("; file configs/detection/shapes.yaml"), line
