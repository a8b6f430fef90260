"""The authors' checkpoints load through timm's normal paths and give the release's logits."""

import pickle
import sys
import types
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

import weightformer  # noqa: F401
from weightformer.checkpoint import CheckpointError, load_checkpoint_file
from weightformer.models import checkpoint_filter_fn
from release_layout import release_forward, release_state_dict
from pickles import CodeRunningPickle


@pytest.fixture(scope="module")
def release_weights() -> dict:
    return release_state_dict(dim=192, depth=17, num_classes=1000, seed=1)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def release_logits(release_weights, images) -> torch.Tensor:
    with torch.no_grad():
        return release_forward(release_weights, images)


def _logits(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(images)


def test_hub_safetensors_file_loads_with_release_logits(tmp_path, release_weights, images, release_logits):
    path = tmp_path / "model.safetensors"
    save_file(release_weights, str(path))
    model = timm.create_model("weightformer_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    torch.testing.assert_close(_logits(model, images), release_logits, rtol=0, atol=1e-4)


class _FakeCfgNode(dict):
    """Pickles under the name of yacs' CfgNode, with its items and attributes, as the release's do."""

    def __init__(self, **items):
        super().__init__(**items)
        self.__dict__["__immutable__"] = True
        self.__dict__["__new_allowed__"] = False


def _save_training_checkpoint(path: Path, state_dict: dict) -> None:
    module = types.ModuleType("yacs.config")
    _FakeCfgNode.__module__, _FakeCfgNode.__qualname__ = "yacs.config", "CfgNode"
    module.CfgNode = _FakeCfgNode
    sys.modules.update({"yacs": types.ModuleType("yacs"), "yacs.config": module})
    try:
        config = _FakeCfgNode(MODEL=_FakeCfgNode(NAME="wfm_tiny"), TRAIN=_FakeCfgNode(EPOCHS=300))
        torch.save({"model": state_dict, "optimizer": {"state": {}, "param_groups": []},
                    "lr_scheduler": {"last_epoch": 3}, "max_accuracy": 76.3, "epoch": 299, "config": config,
                    "scaler": {"scale": 65536.0}}, path)
    finally:
        del sys.modules["yacs"], sys.modules["yacs.config"]


def test_training_pth_loads_with_release_logits(tmp_path, release_weights, images, release_logits):
    path = tmp_path / "wfm-t.pth"
    _save_training_checkpoint(path, release_weights)
    model = timm.create_model("weightformer_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    torch.testing.assert_close(_logits(model, images), release_logits, rtol=0, atol=1e-4)
    assert isinstance(load_checkpoint_file(path)["config"], dict)


def test_hub_download_path_offline(tmp_path, monkeypatch, release_weights, images, release_logits):
    """timm's hf-hub path (``pretrained=True``) resolves RuizeHe/weightformer-t from a local Hub cache."""
    import huggingface_hub.constants as hf_constants

    repo = tmp_path / "models--RuizeHe--weightformer-t"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    save_file(release_weights, str(snapshot / "model.safetensors"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    model = timm.create_model("weightformer_tiny", pretrained=True, cache_dir=str(tmp_path))
    torch.testing.assert_close(_logits(model, images), release_logits, rtol=0, atol=1e-4)


def test_release_weights_fine_tune_to_other_class_counts(tmp_path, release_weights):
    path = tmp_path / "model.safetensors"
    save_file(release_weights, str(path))
    model = timm.create_model("weightformer_tiny", pretrained=True, num_classes=10,
                              pretrained_cfg_overlay=dict(file=str(path)))
    torch.testing.assert_close(model.blocks[1].mlp.fc1.weight, release_weights["blocks.1.linear1.w"].t())
    assert model.head.out_features == 10


def test_filter_maps_every_key_and_keeps_our_own_layout(release_weights):
    model = timm.create_model("weightformer_tiny", device="meta")
    mapped = checkpoint_filter_fn(release_weights, model)
    assert set(mapped) == set(model.state_dict())
    ours = {k: v for k, v in mapped.items()}
    assert checkpoint_filter_fn({"model": {"module." + k: v for k, v in ours.items()}}, model).keys() == ours.keys()


@pytest.fixture(scope="module")
def release_weights_f64(release_weights) -> dict:
    return {k: v.double() for k, v in release_weights.items()}


@pytest.fixture(scope="module")
def release_model_f64(release_weights) -> torch.nn.Module:
    model = timm.create_model("weightformer_tiny")
    model.load_state_dict(checkpoint_filter_fn(release_weights, model))
    return model.double().eval()


# Token grids of 2 (the smallest the release runs), 13, 14 (232 px: the release drops the last 8
# pixels), 15 and 17 (odd: its AvgPool2d(2) leaves out the last row and column). In float64 with a
# tight tolerance, so that a constant off by little (a LayerNorm eps of 1e-5 for 1e-6) shows.
@pytest.mark.parametrize("size", [32, 208, 232, 240, 272])
def test_release_logits_at_every_square_size_it_accepts(release_model_f64, release_weights_f64, size):
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(size), dtype=torch.double)
    expected = release_forward(release_weights_f64, x)
    torch.testing.assert_close(_logits(release_model_f64, x), expected, rtol=1e-9, atol=1e-9)


def test_importing_weightformer_leaves_other_pickle_loading_alone(tmp_path, release_weights):
    """The release's yacs config is readable only inside our loaders, not process-wide after import."""
    path = tmp_path / "wfm-t.pth"
    _save_training_checkpoint(path, {"w": torch.zeros(1)})
    model_path = tmp_path / "wfm-t-model.pth"
    _save_training_checkpoint(model_path, release_weights)

    def refused() -> None:
        with pytest.raises(pickle.UnpicklingError, match="yacs.config.CfgNode"):
            torch.load(path, weights_only=True)

    refused()
    assert isinstance(load_checkpoint_file(path)["config"], dict)
    refused()
    timm.create_model("weightformer_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(model_path)))
    refused()


def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        torch.save({"model": {"w": torch.zeros(1)}, "payload": CodeRunningPickle(str(marker))}, f)
    with pytest.raises(CheckpointError, match="refused to load"):
        load_checkpoint_file(path)
    with pytest.raises((pickle.UnpicklingError, RuntimeError), match="(?i)weights.only"):
        timm.create_model("weightformer_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    assert not marker.exists()


def test_unreadable_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint_file(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="junk.pt"):
        load_checkpoint_file(junk)
    bad_safe = tmp_path / "junk.safetensors"
    bad_safe.write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="safetensors"):
        load_checkpoint_file(bad_safe)


def test_a_text_file_is_not_called_unsafe(tmp_path):
    text = tmp_path / "notes.pt"
    text.write_text("# not a checkpoint\n")
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        load_checkpoint_file(text)
