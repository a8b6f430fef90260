"""The fault classes swept over the commands beside train/eval/predict/export/sample/analyze: bench and ablate
folders belong to one process; a cache's sidecar killed mid-write is a cache miss, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from weightformer.cli import main
from weightformer.engine.run_dir import hold_run_folder

BENCH = {  # command -> (module, the function that would measure: it must never run)
    "sweep": ([], "weightformer.bench.sweep.Sweep.run"),
    "dense": (["dense"], "weightformer.bench.dense.run"),
    "dit": (["dit"], "weightformer.bench.dit.benchmark"),
    "export": (["export"], "weightformer.bench.export.measure"),
}


def _never(*args, **kwargs):
    raise AssertionError("the work started in a folder another process holds")


@pytest.mark.parametrize("suite", list(BENCH))
def test_bench_out_held_by_another_process_is_refused(suite, tmp_path: Path, monkeypatch, capsys):
    words, target = BENCH[suite]
    monkeypatch.setattr(target, _never)
    out = tmp_path / "out"
    with hold_run_folder(out):  # another descriptor: flock refuses it as it would another process
        code = main(["bench", *words, "--out", str(out), *(["--device", "cpu"] if suite != "export" else [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "is in use by process" in err[0] and "--out" in err[0], err


def test_ablate_grid_held_by_another_process_is_refused(tmp_path: Path, monkeypatch, capsys):
    import weightformer.analysis.ablate as ablate

    monkeypatch.setattr(ablate, "plan_ablation", _never)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"output": str(tmp_path / "runs"), "variants": {"a": {}},
                                    "recipe": {"data": "glyph_match:size=32,train=16,val=8", "epochs": 1}}))
    with hold_run_folder(tmp_path / "runs"):
        code = main(["ablate", str(grid)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "is in use by process" in err[0], err


def test_a_latent_cache_without_its_sidecar_is_encoded_again(tmp_path: Path):
    import hashlib
    from types import SimpleNamespace

    import torch
    from safetensors.torch import save_file
    from torch.utils.data import TensorDataset

    from weightformer.generation.latents import encode_split

    class Encoder:  # AutoencoderKL's interface: (B, 1, 8, 8) -> latents (B, 1, 4, 4)
        config = SimpleNamespace(scaling_factor=1.0, in_channels=1)

        def encode(self, x):
            return SimpleNamespace(latent_dist=SimpleNamespace(sample=lambda generator: x[:, :, ::2, ::2]))

    images = TensorDataset(torch.ones(3, 1, 8, 8), torch.arange(3))
    cache = tmp_path / f"{hashlib.sha256(b'k').hexdigest()[:16]}.safetensors"
    save_file({"latents": torch.zeros(1), "labels": torch.zeros(1)}, cache)  # a save killed before its sidecar
    latents = encode_split(Encoder(), images, tmp_path, "k", 2, torch.device("cpu"), 0, progress=False)
    assert latents.tensors[0].shape == (3, 1, 4, 4) and latents.tensors[0].eq(1).all()
    again = encode_split(Encoder(), images, tmp_path, "k", 2, torch.device("cpu"), 0, progress=False)
    assert torch.equal(again.tensors[0], latents.tensors[0])  # now read from the cache


def test_a_journal_line_that_is_no_point_is_one_line(tmp_path: Path):
    import json

    from weightformer.bench.journal import FORMAT, Journal, JournalMismatch

    path = tmp_path / "points.jsonl"
    path.write_text(json.dumps({"format": FORMAT, "settings": {}}) + "\n[1, 2]\n")
    with pytest.raises(JournalMismatch, match="line 2 is not a point"):
        Journal(path, {}, resume=True)


def test_ablate_refuses_a_result_whose_top1_is_not_finite(tmp_path: Path, capsys):
    import json

    import weightformer.analysis.ablate as ablate

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"output": str(tmp_path / "runs"), "variants": {"a": {}},
                                    "recipe": {"data": "glyph_match:size=32,train=16,val=8", "epochs": 1}}))
    config = ablate.load_ablation(grid)
    folder = config.folder("a", 0)
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"config": ablate.resolved_settings(config, "a", 0),
                                                    "top1_last": float("nan"), "top1_best": float("nan")}))
    assert main(["ablate", str(grid)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "top-1 is not a finite number" in err[0], err


def test_metrics_of_a_run_drop_a_torn_last_line_and_refuse_other_garbage(tmp_path: Path):
    from weightformer.engine.errors import ConfigError
    from weightformer.engine.metrics import read_metrics, truncate_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"epoch": 1, "val_top1": 50.0}\n{"epoch": 2, "val_top1": 6')  # the machine lost the end
    assert read_metrics(path) == [{"epoch": 1, "val_top1": 50.0}]
    truncate_metrics(path, 1)  # what --resume auto does with it
    assert path.read_text() == '{"epoch": 1, "val_top1": 50.0}\n'
    path.write_text('[1]\n{"epoch": 1}\n')
    with pytest.raises(ConfigError, match="line 1 is no record of an epoch"):
        read_metrics(path)


def test_a_full_disk_when_an_output_folder_is_made_is_a_resource_error(tmp_path: Path, monkeypatch, capsys):
    import errno

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "mkdir", full)
    assert main(["bench", "dense", "--out", str(tmp_path / "new"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no space left on the device" in err[0] and "new" in err[0], err


def test_a_full_disk_when_the_shapes_data_is_drawn_is_a_resource_error(tmp_path: Path, monkeypatch):
    import errno
    import tempfile

    from weightformer.engine.errors import ResourceError
    from weightformer.segmentation import synthetic

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "cache"))

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "mkdtemp", full)
    with pytest.raises(ResourceError, match="no space left on the device"):
        synthetic.shapes_root()


def test_analyze_transfer_gives_no_accuracy_from_logits_that_are_not_finite():
    import timm
    import torch

    import weightformer.models  # noqa: F401 (registers the models with timm)
    from weightformer.analysis import transfer
    from weightformer.engine.errors import NonFiniteError

    model = timm.create_model("weightformer_tiny", embed_dim=16, depth=1, patch_size=4, in_chans=1, num_classes=2,
                              img_size=16).eval()
    torch.nn.init.constant_(model.get_classifier().bias, float("nan"))
    images, labels = torch.zeros(3, 1, 16, 16), torch.zeros(3, dtype=torch.long)
    with pytest.raises(NonFiniteError, match="non-finite logits"):
        transfer._accuracy(model, images, labels)
    with pytest.raises(NonFiniteError, match="non-finite logits"):
        transfer.swap_diagnosis(model, images, labels, 32, "around", 0.0)


@pytest.mark.parametrize("value", [0.0, float("nan")])
def test_an_erf_without_finite_gradient_mass_gives_no_statistics(value):
    import numpy as np

    from weightformer.analysis.erf import erf_stats
    from weightformer.engine.errors import NonFiniteError

    with pytest.raises(NonFiniteError, match="no finite gradient mass"):
        erf_stats(np.full((8, 8), value))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's, on the covariance of one image
def test_gen_eval_of_one_sample_is_one_line(monkeypatch):
    import numpy as np

    from weightformer.engine.errors import ConfigError
    from weightformer.generation import evaluation, pipeline

    one = np.random.default_rng(0).normal(size=(1, 8))  # the cause: one image's covariance is NaN
    with pytest.raises(np.linalg.LinAlgError):
        evaluation.frechet_distance(one, np.random.default_rng(1).normal(size=(5, 8)))
    monkeypatch.setattr(pipeline, "reference_images", lambda *a, **k: pytest.fail("scored"))
    with pytest.raises(ConfigError, match="at least 2"):
        pipeline.evaluate_samples(np.zeros((1, 28, 28, 1), np.uint8), np.zeros(1, np.int64), "mnist", 28, 0)
