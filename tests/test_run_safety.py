"""No lost runs, no lost results, errors named for what they are: the CLI as a careless user types it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from timm.loss import SoftTargetCrossEntropy  # the classification task's mixup loss
from torchvision import transforms as T
from tqdm import tqdm

import weightformer.classification.task as classification_task
import weightformer.engine.loop as train_module
from conftest_train import make_image_folder
from release_layout import release_state_dict
from weightformer.cli import main
from weightformer.data.transforms import eval_data_config

TINY = ["--model-kwargs", "patch_size=4", "embed_dim=32", "depth=2"]
FLAGS = ["--img-size", "16", "--batch-size", "4", "--workers", "0", "--device", "cpu", "--epochs", "2",
         "--warmup-epochs", "1", *TINY]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("data"), classes=("a", "b"), train_per_class=4, val_per_class=2)


@pytest.fixture(scope="module")
def run(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("run")
    assert main(["train", "--data", str(folder), "--output", str(output), *FLAGS]) == 0
    return output


# ---------------------------------------------------------------------------------------------------
# The run folder
# ---------------------------------------------------------------------------------------------------
def test_a_new_run_into_a_run_folder_is_refused_and_overwrite_keeps_the_old_files(folder, tmp_path, capsys):
    output = tmp_path / "run"
    assert main(["train", "--data", str(folder), "--output", str(output), *FLAGS, "--epochs", "1"]) == 0
    old_last, old_metrics = (output / "last.pt").read_bytes(), (output / "metrics.jsonl").read_text()
    capsys.readouterr()

    assert main(["train", "--data", str(folder), "--output", str(output), *FLAGS, "--epochs", "1"]) == 2
    err = _error_line(capsys)
    assert "already holds a run" in err and "--resume auto" in err and "--overwrite" in err
    assert (output / "last.pt").read_bytes() == old_last and (output / "metrics.jsonl").read_text() == old_metrics

    assert main(["train", "--data", str(folder), "--output", str(output), *FLAGS, "--epochs", "1", "--overwrite"]) == 0
    assert "moved to" in capsys.readouterr().out
    [previous] = list(output.glob("previous-*"))
    assert (previous / "last.pt").read_bytes() == old_last and (previous / "metrics.jsonl").read_text() == old_metrics
    assert len((output / "metrics.jsonl").read_text().splitlines()) == 1  # the new run's own record only


def test_interrupted_save_leftovers_are_removed(folder, tmp_path, capsys):
    output = tmp_path / "run"
    output.mkdir()
    leftover = output / ".last.pt.abc123.tmp"  # what save_atomic leaves when killed mid-write
    leftover.write_bytes(b"partial")
    assert main(["train", "--data", str(folder), "--output", str(output), *FLAGS, "--max-steps", "1"]) == 0
    assert not leftover.exists()
    assert "unfinished checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["file", "proc"])
def test_bad_output_path_fails_before_the_data_scan(tmp_path, capsys, where):
    output = tmp_path / "a_file" if where == "file" else Path("/proc/weightformer_run")
    if where == "file":
        output.write_text("not a folder")
    # The data does not exist: had the data been scanned first, the error would be about the data.
    assert main(["train", "--data", str(tmp_path / "no_such_data"), "--output", str(output), *FLAGS]) == 2
    err = _error_line(capsys)
    assert "--output" in err and "no_such_data" not in err


# ---------------------------------------------------------------------------------------------------
# Resume and init
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["best.pt", "state_dict.pt", "state_dict.safetensors"])
def test_resume_from_weights_only_names_init(run, tmp_path, capsys, kind):
    state = torch.load(run / "best.pt", weights_only=True)["model"]
    path = run / "best.pt" if kind == "best.pt" else tmp_path / kind
    if kind == "state_dict.pt":
        torch.save(state, path)
    elif kind == "state_dict.safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    assert main(["train", "--data", str(run.parent), "--output", str(tmp_path / "out"), "--resume", str(path)]) == 2
    err = _error_line(capsys)
    assert "weights only" in err and f"--init {path}" in err


def test_resume_from_a_folder_says_it_is_a_folder(run, tmp_path, capsys):
    assert main(["train", "--output", str(tmp_path / "out"), "--resume", str(run)]) == 2
    assert "is a folder" in _error_line(capsys)


def test_init_starts_a_new_run_and_refits_the_classifier(run, tmp_path, capsys):
    three = make_image_folder(tmp_path / "three", classes=("x", "y", "z"), train_per_class=4, val_per_class=1)
    output = tmp_path / "out"
    assert main(["train", "--data", str(three), "--output", str(output), *FLAGS, "--max-steps", "1",
                 "--init", str(run / "best.pt")]) == 0
    out = capsys.readouterr().out
    assert "initialised from the weights in" in out and "classifier (head.weight, head.bias)" in out
    saved = torch.load(output / "last.pt", weights_only=True)
    assert saved["global_step"] == 1 and saved["model"]["head.weight"].shape[0] == 3
    before = torch.load(run / "best.pt", weights_only=True)["model"]["patch_embed.proj.weight"]
    # One small step away from the initial weights, not from a random initialisation.
    assert (saved["model"]["patch_embed.proj.weight"] - before).abs().max() < 0.05


def test_resume_on_data_with_other_channels_names_the_channels(run, folder, tmp_path, capsys):
    ckpt = torch.load(run / "last.pt", weights_only=True)
    ckpt["meta"]["in_chans"] = 1  # as if trained on grey digits
    fake = tmp_path / "last.pt"
    torch.save(ckpt, fake)
    assert main(["train", "--data", str(folder), "--output", str(tmp_path / "o"), "--resume", str(fake)]) == 2
    err = _error_line(capsys)
    assert "1-channel" in err and "3-channel" in err and "model-kwargs" not in err
    assert main(["eval", "--checkpoint", str(fake), "--data", str(folder), "--workers", "0"]) == 2
    assert "1-channel" in _error_line(capsys)


# ---------------------------------------------------------------------------------------------------
# Batch, learning rate, divergence, progress bars
# ---------------------------------------------------------------------------------------------------
def test_data_smaller_than_a_batch_trains_with_a_capped_batch_and_scaled_lr(folder, tmp_path, capsys):
    # 8 training images, default-sized batch of 128.
    args = ["train", "--data", str(folder), "--output", str(tmp_path / "o"), "--img-size", "16", "--workers", "0",
            "--device", "cpu", "--max-steps", "1", "--batch-size", "128", "--lr", "5e-4", *TINY]
    with pytest.warns(UserWarning, match="using batch 8"):
        assert main(args) == 0
    captured = capsys.readouterr()
    assert "batch 8 per process (total 8), lr 0.0005 x 8/512" in captured.out
    saved = torch.load(tmp_path / "o" / "last.pt", weights_only=True)
    assert saved["optimizer"]["param_groups"][0]["initial_lr"] == pytest.approx(5e-4 * 8 / 512)


def test_non_finite_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_checkpoint(
        folder, tmp_path, capsys, monkeypatch):
    output = tmp_path / "o"
    calls = {"n": 0}
    real_loss = SoftTargetCrossEntropy.forward

    def loss_that_diverges(self, x, target):
        calls["n"] += 1
        loss = real_loss(self, x, target)
        return loss * float("nan") if calls["n"] == 3 else loss  # step 1 of epoch 2 (2 steps an epoch)

    monkeypatch.setattr(SoftTargetCrossEntropy, "forward", loss_that_diverges)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # progress bars on, as on a terminal
    assert main(["train", "--data", str(folder), "--output", str(output), "--set", "mixup=0.8", *FLAGS]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: the loss became nan at step 3 (epoch 2, step 1 of 2)")
    assert str(output / "last.pt") in err
    saved = torch.load(output / "last.pt", weights_only=True)
    assert saved["global_step"] == 2 and all(torch.isfinite(v).all() for v in saved["model"].values())
    assert len(tqdm._instances) == 0  # the bar of the failed epoch was closed


@pytest.mark.parametrize("value", ["inf", "nan"])
def test_non_finite_learning_rate_is_refused(tmp_path, capsys, value):
    assert main(["train", "--output", str(tmp_path), "--lr", value]) == 2
    assert "finite" in _error_line(capsys)


# ---------------------------------------------------------------------------------------------------
# Errors named for what they are
# ---------------------------------------------------------------------------------------------------
def test_out_of_memory_says_so(folder, tmp_path, capsys, monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(train_module, "train_one_epoch", oom)
    assert main(["train", "--data", str(folder), "--output", str(tmp_path / "o"), *FLAGS]) == 1
    err = _error_line(capsys)
    assert "out of memory" in err and "--batch-size" in err and "--grad-checkpointing" in err
    assert "cannot take" not in err


def test_a_bug_keeps_its_traceback_and_says_where_to_report_it(folder, tmp_path, capsys, monkeypatch):
    def bug(*args, **kwargs):
        raise RuntimeError("index out of range in self")

    monkeypatch.setattr(train_module, "train_one_epoch", bug)
    assert main(["train", "--data", str(folder), "--output", str(tmp_path / "o"), *FLAGS]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "index out of range" in err and "issue tracker" in err


def test_a_type_error_inside_a_model_is_not_blamed_on_model_kwargs(tmp_path, capsys, monkeypatch):
    import weightformer.models.weightformer as wf

    def broken_init(self, *args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    monkeypatch.setattr(wf.WeightFormer, "__init__", broken_init)
    assert main(["train", "--output", str(tmp_path / "o"), "--max-steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "model-kwargs" not in err


@pytest.mark.parametrize("args, message", [
    (["--set", "garbage"], "--set 'garbage' is not KEY=VALUE"),
    (["--model-kwargs", "garbage"], "--model-kwargs 'garbage' is not KEY=VALUE"),
])
def test_bad_key_values_name_their_flag(tmp_path, capsys, args, message):
    assert main(["train", "--output", str(tmp_path), *args]) == 2
    assert message in _error_line(capsys)


# ---------------------------------------------------------------------------------------------------
# eval
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["--batch-size", "0"], "--batch-size must be"),
    (["--workers", "-1"], "--workers must be"),
    (["--img-size", "-5"], "--img-size must be"),
    (["--img-size", "0"], "--img-size must be"),
    (["--img-size", "3"], "cannot take 3 px images"),  # smaller than the 4 px patch of this run's model
])
def test_eval_settings_are_checked(run, capsys, args, message):
    assert main(["eval", "--checkpoint", str(run / "best.pt"), "--workers", "0", *args]) == 2
    assert message in _error_line(capsys)


@pytest.mark.parametrize("where", ["folder", "proc"])
def test_eval_json_path_is_checked_before_the_work(run, tmp_path, capsys, where):
    path = tmp_path if where == "folder" else Path("/proc/weightformer.json")
    assert main(["eval", "--checkpoint", str(run / "best.pt"), "--workers", "0", "--json", str(path)]) == 2
    captured = capsys.readouterr()
    assert "--json" in captured.err and "top-1" not in captured.out  # refused before evaluating


def test_eval_results_are_printed_before_they_are_written(run, tmp_path, capsys, monkeypatch):
    path = tmp_path / "r.json"
    real_write_text = Path.write_text

    def disk_full(self, *args, **kwargs):
        if self.name == path.name:  # the file, or its temporary twin (written first, then renamed)
            raise OSError(28, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", disk_full)
    assert main(["eval", "--checkpoint", str(run / "best.pt"), "--workers", "0", "--json", str(path)]) == 1
    captured = capsys.readouterr()
    assert "top-1" in captured.out and "no space left on the device" in captured.err


def test_eval_counts_the_images_it_evaluated(run, capsys, tmp_path):
    path = tmp_path / "r.json"
    assert main(["eval", "--checkpoint", str(run / "best.pt"), "--workers", "0", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["num_samples"] == 4 and result["skipped_files"] == []
    assert "(4 images of" in capsys.readouterr().out


def test_eval_pretrained_offline_is_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    data = make_image_folder(tmp_path / "d", classes=("a",), train_per_class=1, val_per_class=1)
    out = subprocess.run([sys.executable, "-m", "weightformer", "eval", "--model", "weightformer_tiny", "--pretrained",
                          "--data", str(data), "--workers", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot get the pretrained weights of weightformer_tiny")


# ---------------------------------------------------------------------------------------------------
# Preprocessing and the authors' checkpoints
# ---------------------------------------------------------------------------------------------------
def test_weightformer_eval_preprocessing_is_the_release_squash_resize():
    """The release resizes the whole image to a square (256/224 of the crop), then centre-crops."""
    config = eval_data_config(timm.models.get_pretrained_cfg("weightformer_tiny").to_dict())
    ours = timm.data.create_transform(**config, is_training=False)
    release = T.Compose([
        T.Resize((256, 256), interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(224), T.ToTensor(),
        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])
    g = torch.Generator().manual_seed(0)
    image = Image.fromarray((torch.rand(300, 500, 3, generator=g) * 255).to(torch.uint8).numpy())  # not square
    torch.testing.assert_close(ours(image), release(image), rtol=0, atol=1e-6)


def test_training_validates_with_the_models_eval_preprocessing(folder):
    from weightformer.engine import prepare_config
    from weightformer.engine.distributed import init_distributed

    cfg = prepare_config({"data": str(folder), "img_size": 32, "workers": 0, "device": "cpu"},
                         task=classification_task.ClassificationTask).cfg
    task = classification_task.ClassificationTask(cfg)
    data = train_module.build_data(cfg, task, init_distributed("cpu"))
    assert data.task_data.meta["crop_mode"] == "squash"  # WeightFormer's pretrained config: the release's resize
    val_transform = data.task_data.val_set.transform
    image = Image.new("RGB", (40, 20), (10, 200, 30))
    image.paste((250, 0, 0), (0, 0, 4, 20))  # a red band that a shorter-side resize would crop away
    expected = T.Compose([T.Resize((36, 36), interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(32),
                          T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])(image)
    torch.testing.assert_close(val_transform(image), expected, rtol=0, atol=1e-6)


def test_eval_reads_the_authors_training_checkpoint(folder, tmp_path, capsys):
    """The release's .pth ({'model', 'optimizer', 'config': yacs CfgNode}) through the one loader."""
    release = release_state_dict(dim=32, depth=2, num_classes=2, patch=4)
    path = tmp_path / "ckpt_epoch_299.pth"
    config = OrderedDict(MODEL=OrderedDict(TYPE="wfm"))
    torch.save({"model": release, "optimizer": {}, "epoch": 299, "config": config}, path,
               _use_new_zipfile_serialization=False)  # a plain pickle stream, so the class name can be swapped
    pickled = path.read_bytes()
    assert b"ccollections\nOrderedDict\n" in pickled
    path.write_bytes(pickled.replace(b"ccollections\nOrderedDict\n", b"cyacs.config\nCfgNode\n"))
    assert main(["eval", "--checkpoint", str(path), "--model", "weightformer_tiny", "--data", str(folder),
                 "--img-size", "16", "--workers", "0", *TINY]) == 0
    assert "top-1" in capsys.readouterr().out


def test_weights_for_other_channels_name_the_channels(run, tmp_path, capsys):
    """A bare state dict of a 3-channel model evaluated on 1-channel digits: the channels are the cause."""
    state = torch.load(run / "best.pt", weights_only=True)["model"]
    path = tmp_path / "rgb_weights.pt"
    torch.save(state, path)
    assert main(["eval", "--checkpoint", str(path), "--model", "weightformer_tiny", "--data", "mnist",
                 "--img-size", "16", "--workers", "0", *TINY]) == 2
    err = _error_line(capsys)
    assert "3-channel images" in err and "1-channel" in err


def test_eval_of_another_tasks_checkpoint_names_its_command(run, tmp_path, capsys):
    ckpt = torch.load(run / "best.pt", weights_only=True)
    ckpt["meta"]["task"] = "segmentation"
    path = tmp_path / "seg.pt"
    torch.save(ckpt, path)
    assert main(["eval", "--checkpoint", str(path), "--workers", "0"]) == 2
    assert "weightformer seg eval" in _error_line(capsys)


def test_resume_and_init_together_are_refused_from_flags_and_from_python(run, tmp_path, capsys):
    from weightformer.classification.config import ClassificationConfig
    from weightformer.engine import ConfigError, train

    assert main(["train", "--output", str(tmp_path / "o"), "--resume", "auto", "--init", str(run / "best.pt")]) == 2
    assert "pass only one of them" in _error_line(capsys)
    with pytest.raises(ConfigError, match="pass only one of them"):
        train(ClassificationConfig(output=str(tmp_path / "p"), resume="auto", init=str(run / "best.pt")),
              task="classification")


def test_tasks_on_the_same_data_get_their_own_default_run_folder():
    """`weightformer det train` and `weightformer seg train` both default to the shapes data: their runs must not meet."""
    from weightformer.classification import ClassificationTask
    from weightformer.detection import DetectionTask
    from weightformer.engine import TrainConfig
    from weightformer.segmentation import SegmentationTask

    cfg = TrainConfig(data="shapes", model="weightformer_tiny")  # TrainConfig names no model of its own
    folders = [train_module._default_output(cfg, task) for task in (ClassificationTask, DetectionTask, SegmentationTask)]
    assert folders == ["runs/shapes_weightformer_tiny", "runs/det_shapes_weightformer_tiny",
                       "runs/seg_shapes_weightformer_tiny"]
