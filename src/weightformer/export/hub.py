"""timm's Hugging Face Hub layout: ``config.json`` and ``model.safetensors`` (timm's ``save_for_hf``) and a model
card, ``README.md``. After ``import weightformer`` the folder loads with ``timm.create_model("local-dir:FOLDER",
pretrained=True)`` (``hf-hub:ORG/NAME`` once uploaded) and in transformers' timm wrapper, for which config.json
carries the class count and the class names at its root only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch
from timm.models import save_for_hf
from timm.models._hub import generate_readme, get_model_args  # (not re-exported by timm.models)
from torch import nn

from ..data.folder import LUMA
from ..engine.errors import ConfigError
from ..engine.metrics import json_text
from ..engine.outputs import output_folder

__all__ = ["model_card", "push_to_hub", "to_hf"]

# The settings of a run that the card lists (the rest are in the checkpoint's config).
CARD_SETTINGS = ("data", "model", "model_kwargs", "img_size", "epochs", "batch_size", "lr", "weight_decay",
                 "mixup", "cutmix", "smoothing", "ema", "seed")


def _data_config(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The preprocessing a checkpoint was trained with, in timm's data-config keys (None: the model's own)."""
    if "img_size" not in meta:
        return None
    size = meta["img_size"]
    return {"input_size": (meta["in_chans"], size, size), "mean": tuple(meta["mean"]), "std": tuple(meta["std"]),
            "interpolation": meta["interpolation"], "crop_pct": meta["crop_pct"], "crop_mode": meta["crop_mode"]}


def model_card(name: str, model: nn.Module, meta: Mapping[str, Any], run: Mapping[str, Any] | None = None,
               command: str | None = None, repo_id: str | None = None) -> str:
    """README.md text: what the model is, its validation metrics, how it was trained and exported, how to load it."""
    run = run or {}
    cfg = model.pretrained_cfg
    details: dict[str, Any] = {
        "Model type": "Image classification / feature backbone",
        "Architecture": f"{meta['model']} ({cfg.get('paper_name', 'timm model')})",
        "Classes": model.num_classes,
        "Input": f"{meta['in_chans']} × {meta.get('img_size', cfg.get('input_size', ('', 224))[-1])} px"
                 + (" (RGB: the grayscale model with PIL's luma weights folded into its stem)"
                    if meta.get("rgb_from_luma") else ""),
        "Parameters (M)": round(sum(p.numel() for p in model.parameters()) / 1e6, 3),
    }
    if run.get("data"):
        details["Training data"] = run["data"]  # not "Dataset", which timm's card lists as a Hub data set id
    if cfg.get("paper_ids"):
        details["Papers"] = f"{cfg.get('paper_name', '')} ({cfg['paper_ids']})"
    metrics = run.get("metrics") or {}
    if metrics:
        epoch = f" (epoch {run['epoch']})" if run.get("epoch") is not None else ""
        details[f"Validation metrics{epoch}"] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()}
    settings = {k: run["config"][k] for k in CARD_SETTINGS if k in (run.get("config") or {})}
    if settings:
        details["Trained with `weightformer train`"] = settings
    if command:
        details["Exported with"] = f"`{command}`"
    usage = ("```python\nimport timm\nimport weightformer  # registers the WeightFormer architectures with timm\n\n"
             f"model = timm.create_model(\"{'hf-hub:' + repo_id if repo_id else 'local-dir:' + name}\", "
             "pretrained=True).eval()\n"
             "transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))\n```\n\n"
             "With transformers (its timm wrapper):\n\n"
             "```python\nimport weightformer  # first: transformers builds the model with timm.create_model\n"
             "from transformers import AutoImageProcessor, AutoModelForImageClassification\n\n"
             f"processor = AutoImageProcessor.from_pretrained(\"{repo_id or name}\")\n"
             f"model = AutoModelForImageClassification.from_pretrained(\"{repo_id or name}\").eval()\n```\n")
    card = {"details": details, "usage": usage, "license": cfg.get("license", "mit"),
            "tags": ["image-classification", "timm", "weightformer"],
            "description": f"A `{meta['model']}` classifier exported by weightformer in timm's Hub layout."}
    return generate_readme(card, name)


def to_hf(model: nn.Module, directory: str | Path, meta: Mapping[str, Any] | None = None,
          run: Mapping[str, Any] | None = None, command: str | None = None, repo_id: str | None = None,
          overwrite: bool = False) -> Path:
    """Write ``model`` in timm's Hub layout into ``directory``, through a temporary folder (an existing one is
    replaced only with ``overwrite``). ``meta``: a checkpoint's (preprocessing and class names go into the
    config); ``run``: the card's metrics and settings (:func:`~weightformer.export.source.run_summary`)."""
    directory = Path(directory)
    meta = dict(meta or {"model": model.pretrained_cfg["architecture"], "in_chans": getattr(model, "in_chans", 3)})
    model_config: dict[str, Any] = {}
    label_names = meta.get("classes")
    if not label_names and model.pretrained_cfg.get("num_classes") == model.num_classes:
        # a model timm loaded from a Hub folder keeps them in its pretrained_cfg; transformers reads the root's
        label_names = model.pretrained_cfg.get("label_names")
    if label_names:
        model_config["label_names"] = label_names if isinstance(label_names, dict) else list(label_names)
    if meta.get("data"):
        model_config["pretrained_cfg"] = {"tag": str(meta["data"]).replace("/", "_")}
    rgb = _taking_rgb(model) if meta.get("in_chans") == 1 else None
    if rgb is not None:  # transformers' pipeline converts every image to RGB
        model, meta = rgb, _rgb_meta(meta)
    with output_folder(directory, overwrite) as tmp:
        save_for_hf(model, str(tmp), model_config=model_config, safe_serialization=True, data_config=_data_config(meta))
        _loadable_by_transformers(tmp / "config.json")
        name = repo_id.split("/")[-1] if repo_id else directory.name
        (tmp / "README.md").write_text(model_card(name, model, meta, run, command, repo_id), encoding="utf-8")
    return directory


def _taking_rgb(model: nn.Module) -> nn.Module | None:
    """A copy of a 1-channel ``model`` that takes RGB images: its stem's (out, 1, kh, kw) weights times PIL's luma
    weights, (out, 3, kh, kw); None if it has no such stem. On an RGB image normalised with the grey mean and std
    in each channel, it computes what ``model`` computes on the image's luma (PIL's "L" before PIL rounds it to
    8 bits)."""
    stem = f"{model.pretrained_cfg.get('first_conv') or 'patch_embed.proj'}.weight"
    state = model.state_dict()
    if stem not in state or state[stem].dim() != 4 or state[stem].shape[1] != 1:
        return None
    rgb = timm.create_model(model.pretrained_cfg["architecture"], **{**get_model_args(model), "in_chans": 3})
    state[stem] = state[stem] * torch.tensor(LUMA, dtype=state[stem].dtype).view(1, 3, 1, 1)
    rgb.load_state_dict(state)
    rgb.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, *model.pretrained_cfg["input_size"][1:])}
    return rgb.eval()


def _rgb_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` of a 1-channel model as the RGB copy of :func:`_taking_rgb` takes its input: its grey mean and
    std in each channel."""
    rgb = {**meta, "in_chans": 3, "rgb_from_luma": True}
    rgb.update({k: [meta[k][0]] * 3 for k in ("mean", "std") if meta.get(k)})
    return rgb


def _loadable_by_transformers(config_file: Path) -> None:
    """Drop ``num_classes`` from a timm config.json's ``model_args``: transformers' timm wrapper passes the root's
    to ``timm.create_model`` as well, which a second one stops ("got multiple values for keyword argument")."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config.get("model_args", {}).pop("num_classes", None)
    config_file.write_text(json_text(config, indent=2), encoding="utf-8")  # indent as timm writes it


def push_to_hub(directory: str | Path, repo_id: str, private: bool = False, token: str | None = None,
                commit_message: str = "Add model (weightformer export)") -> str:
    """Upload a folder written by :func:`to_hf` to the Hub repository ``repo_id`` (created if needed);
    returns the commit URL. A refused login or repository name is a :class:`ConfigError`."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalTokenNotFoundError

    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ConfigError(f"--push-to-hub takes ORG/NAME, got {repo_id!r}; e.g. --push-to-hub my-org/weightformer-t-mnist")
    api = HfApi(token=token, library_name="weightformer")
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=repo.repo_id, folder_path=str(directory), commit_message=commit_message)
    except (HfHubHTTPError, HFValidationError, LocalTokenNotFoundError) as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot upload to the Hub repository {repo_id} ({detail}); log in with `hf auth login` "
                          f"or set HF_TOKEN, and check the repository name") from exc
    return str(getattr(commit, "commit_url", commit))
