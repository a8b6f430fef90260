"""Every task's command line is built by the engine from the task: the legacy commands' flags parse to
the same settings, the shared flags exist once per task, the help speaks of
the task, and the root command only dispatches."""

from __future__ import annotations

import pytest

from weightformer.cli import main
from weightformer.engine import get_task
from weightformer.engine.cli import build_parser, train_overrides

COMMON = ["--config", "run.yaml", "--data", "D", "--model", "weightformer_small", "--model-kwargs", "depth=2",
          "--model-arg", "embed_dim=32", "--epochs", "3", "--max-steps", "5", "--batch-size", "2", "--img-size", "64",
          "--lr", "1e-3", "--warmup-epochs", "0.5", "--output", "O", "--resume", "auto", "--overwrite", "--seed", "7",
          "--deterministic", "--workers", "0", "--amp", "bf16", "--compile", "--grad-checkpointing", "--ema",
          "--device", "cpu", "--log-interval", "9", "--set", "weight_decay=0.1"]
COMMON_SETTINGS = dict(data="D", model="weightformer_small", model_kwargs={"depth": 2, "embed_dim": 32}, epochs=3,
                       max_steps=5, batch_size=2, img_size=64, lr=1e-3, warmup_epochs=0.5, output="O", resume="auto",
                       overwrite=True, seed=7, deterministic=True, workers=0, amp="bf16", compile=True,
                       grad_checkpointing=True, ema=True, device="cpu", log_interval=9, weight_decay=0.1)
# The task flags of the legacy commands (weightformer det/seg/gen train --help of commit 85154e8).
TASK_FLAGS = {
    "classification": ([], {}),
    "detection": (["--num-classes", "5", "--cascade", "--layer-decay", "0.7", "--det-resize", "shortest_edge",
                   "--det-max-size", "999"],
                  dict(num_classes=5, cascade=True, layer_decay=0.7, det_resize="shortest_edge", det_max_size=999)),
    "segmentation": (["--num-classes", "5", "--no-reduce-zero-label", "--layer-decay", "0.7", "--inference", "slide",
                      "--crop", "64", "--stride", "32"],
                     dict(num_classes=5, reduce_zero_label=False, layer_decay=0.7, seg_inference="slide", seg_crop=64,
                          seg_stride=32)),
    "generation": (["--vae", "V", "--min-snr-gamma", "5"], dict(vae="V", min_snr_gamma=5.0)),
}


@pytest.mark.parametrize("name", list(TASK_FLAGS))
def test_the_flags_of_before_parse_to_the_same_settings(name: str):
    task = get_task(name)
    flags, settings = TASK_FLAGS[name]
    args = build_parser(task).parse_args(["train", *COMMON, *flags])
    assert args.config_file == "run.yaml"
    assert train_overrides(args, task) == {**COMMON_SETTINGS, **settings}


@pytest.mark.parametrize("name, speaks_of", [
    ("classification", "any timm model name"), ("detection", "COCO"), ("segmentation", "ADE20K"),
    ("generation", "wf_dit"),
])
def test_each_tasks_train_help_speaks_of_that_task(name: str, speaks_of: str, capsys):
    task = get_task(name)
    with pytest.raises(SystemExit):
        build_parser(task).parse_args(["train", "--help"])
    text = capsys.readouterr().out
    assert speaks_of in text and "recipe" in text.lower()
    options = [line.split()[0] for line in text.splitlines() if line.startswith("  -")]
    assert options.count("--model-kwargs") == 1 and options.count("--resume") == 1  # each shared flag once
    if name != "classification":
        assert "imagenet_weightformer_t.yaml" not in text
    if name == "generation":
        assert "any timm model name" not in text


def test_the_root_command_dispatches_and_refuses_a_typo_in_one_line(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("train", "eval", "predict", "det", "seg", "gen", "cls", "export", "bench"))
    assert main(["trian"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "weightformer: error: unknown command 'trian'"


def test_the_wrong_task_message_names_a_command_that_works_for_that_checkpoint(capsys):
    from pathlib import Path

    legacy = Path(__file__).resolve().parent / "data" / "legacy_checkpoints"
    assert main(["eval", "--checkpoint", str(legacy / "gen" / "best.pt")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    suggested = line.split("(e.g. ")[1].rstrip(")").split()
    assert suggested[:3] == ["weightformer", "gen", "sample"]  # gen eval takes samples, not a checkpoint
    args = build_parser(get_task("generation")).parse_args(suggested[2:])  # the command it names parses
    assert args.checkpoint == str(legacy / "gen" / "best.pt")
