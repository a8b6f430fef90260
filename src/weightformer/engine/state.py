"""What a checkpoint holds, and how a model is rebuilt from it.

A training checkpoint is a dict of tensors and plain Python values only, so it loads with
``torch.load(weights_only=True)``:

    model, ema            state dicts (ema is None without --ema)
    optimizer, scheduler, scaler
    epoch, step_in_epoch, global_step   where the run stands: epoch index, optimizer steps taken
                                        in it, optimizer steps in total
    progress              running sums of the current epoch (loss, samples, seconds) and the best result
    rng                   per-rank generator states (torch, cuda, numpy, python)
    meta                  what rebuilds the model without flags: timm name, kwargs, classes, data, transforms
    config                the resolved TrainConfig as a dict
"""

from __future__ import annotations

import os
import random
import re
import sys
from typing import Any, Callable, Mapping, Optional

import numpy as np
import timm
import torch
from huggingface_hub.errors import HfHubHTTPError
from torch import nn

from ..checkpoint import CheckpointError, load_checkpoint_file, strip_wrapper_prefixes
from .errors import ConfigError

__all__ = [
    "load_backbone_weights",
    "TRAINING_STATE_KEYS",
    "build_model",
    "capture_rng",
    "check_input_size",
    "is_training_checkpoint",
    "load_model_state",
    "load_weights",
    "model_state_from",
    "read_checkpoint",
    "restore_rng",
]

# What a checkpoint needs beyond the weights for a run to continue exactly where it stopped.
TRAINING_STATE_KEYS = ("optimizer", "scheduler", "scaler", "epoch", "step_in_epoch", "global_step", "progress", "rng")


def capture_rng() -> dict[str, Any]:
    """This process's torch, CUDA, NumPy and Python generator states, as tensors and plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": random.getstate(),
    }


def restore_rng(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def build_model(meta: Mapping[str, Any], pretrained: bool = False) -> nn.Module:
    """``timm.create_model`` from a checkpoint's ``meta`` (name, kwargs, classes, channels).

    Only the errors that mean a bad argument become a :class:`ConfigError`: a ``ValueError`` the
    model raises for a value it refuses, and the ``TypeError`` of a keyword it does not take. Pretrained
    weights that cannot be fetched (offline, no such repository) are a :class:`CheckpointError`.
    Anything else is a bug and keeps its traceback.
    """
    name = meta["model"]
    if not timm.is_model(name):
        raise CheckpointError(f"unknown timm model {name!r}; check the name with timm.list_models('{name[:8]}*')")
    kwargs = meta["model_kwargs"]
    try:
        return timm.create_model(
            name, pretrained=pretrained, num_classes=meta["num_classes"], in_chans=meta["in_chans"], **kwargs
        )
    except TypeError as exc:
        if not _SIGNATURE_ERROR.search(str(exc)):
            raise
        raise ConfigError(f"{name} does not take the model arguments {kwargs}: {exc}; check --model-kwargs") from exc
    except ValueError as exc:
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot build {name} with model arguments {kwargs}: {detail}; check --model-kwargs") from exc
    except (HfHubHTTPError, OSError) as exc:
        if not pretrained:
            raise
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(
            f"cannot get the pretrained weights of {name} ({type(exc).__name__}: {detail}); connect to the "
            f"Hugging Face Hub (HF_HUB_OFFLINE unset), or pass the downloaded file with --checkpoint FILE"
        ) from exc


# The TypeError Python raises when a call's keywords do not fit the signature (not one from inside the model).
_SIGNATURE_ERROR = re.compile(r"unexpected keyword argument|multiple values for (keyword )?argument")


def _blank_forward(model: nn.Module, in_chans: int, size: int, device: torch.device) -> None:
    with torch.no_grad():
        model(torch.zeros(1, in_chans, size, size, device=device))


def check_input_size(model: nn.Module, meta: Mapping[str, Any], device: torch.device) -> None:
    """One eval-mode forward of a blank image, so a model that cannot take this size fails with one line.

    A ValueError, or the AssertionError of timm's size checks, is a refusal of the input: a user's
    mistake. A RuntimeError (a kernel larger than the feature map, say) counts as one only when the
    same model runs at its pretrained size; otherwise, and for out of memory, it is reported as
    what it is.
    """
    was_training = model.training
    model.eval()
    size = meta["img_size"]
    try:
        _blank_forward(model, meta["in_chans"], size, device)
    except (ValueError, AssertionError, RuntimeError) as exc:
        if isinstance(exc, (torch.OutOfMemoryError, NotImplementedError)) or "can't allocate memory" in str(exc):
            raise
        if isinstance(exc, RuntimeError):
            reference = (getattr(model, "pretrained_cfg", None) or {}).get("input_size", (3, 224, 224))[-1]
            if reference == size:
                raise
            try:
                _blank_forward(model, meta["in_chans"], reference, device)
            except Exception:
                raise exc from None  # fails at its own size too: not a matter of the image size
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{meta['model']} cannot take {size} px images ({reason}); "
            f"pass a larger --img-size or model kwargs that fit (e.g. a smaller patch_size)"
        ) from exc
    model.train(was_training)


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint without running pickled code (safetensors, or ``torch.load(weights_only=True)``)."""
    if os.path.isdir(path):
        raise CheckpointError(
            f"{path} is a folder, not a checkpoint file; pass a file in it such as {os.path.join(path, 'last.pt')}"
        )
    obj = load_checkpoint_file(path)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a dict of weights")
    return obj


def is_training_checkpoint(checkpoint: Mapping[str, Any]) -> bool:
    """Whether ``checkpoint`` holds a whole training state (``last.pt``), not only weights."""
    return all(key in checkpoint for key in TRAINING_STATE_KEYS)


def model_state_from(checkpoint: Mapping[str, Any], use_ema: bool = False, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The model weights in a checkpoint: ours (``model``/``ema``), timm/DeiT style, or a bare state dict."""
    if use_ema:
        if checkpoint.get("ema") is None:
            raise CheckpointError(f"{source} has no EMA weights (the run did not use --ema); drop --ema")
        return dict(checkpoint["ema"])
    for key in ("model", "state_dict", "model_ema", "state_dict_ema"):
        if isinstance(checkpoint.get(key), Mapping):
            return dict(checkpoint[key])
    return dict(checkpoint)


def load_model_state(model: nn.Module, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy ``state`` into ``model``, or raise :class:`CheckpointError` naming what does not match.

    A classifier of another size is reported as a class-count mismatch; other differences list
    the first missing, unexpected and differently shaped keys.
    """
    state = strip_wrapper_prefixes(state)
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    reshaped = [k for k in expected if k in state and tuple(state[k].shape) != tuple(expected[k].shape)]
    if not (missing or unexpected or reshaped):
        model.load_state_dict(state)
        return
    pretrained_cfg = getattr(model, "pretrained_cfg", None) or {}
    stem_weight = f"{pretrained_cfg.get('first_conv', 'patch_embed.proj')}.weight"
    if stem_weight in reshaped and state[stem_weight].dim() == 4 and expected[stem_weight].dim() == 4 \
            and state[stem_weight].shape[0] == expected[stem_weight].shape[0] \
            and state[stem_weight].shape[1] != expected[stem_weight].shape[1]:  # (out, in_chans, kh, kw)
        raise CheckpointError(
            f"{source} takes {state[stem_weight].shape[1]}-channel images and the model was built for "
            f"{expected[stem_weight].shape[1]}-channel images (the data's); use data with "
            f"{state[stem_weight].shape[1]} channel(s)"
        )
    classifier = pretrained_cfg.get("classifier", "head")
    head_weight = f"{classifier}.weight"
    only_head = all(k.startswith(f"{classifier}.") for k in reshaped)
    if head_weight in reshaped and only_head and not (missing or unexpected):
        raise CheckpointError(
            f"{source} has {state[head_weight].shape[0]} classes, the model has {expected[head_weight].shape[0]}; "
            f"use a checkpoint trained on this data set, or data with the checkpoint's classes"
        )
    details = []
    if reshaped:
        shapes = ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}" for k in reshaped[:3])
        details.append(f"{len(reshaped)} shape mismatch(es) (checkpoint vs model): {shapes}")
    if missing:
        details.append(f"{len(missing)} weight(s) missing from it, e.g. {', '.join(missing[:3])}")
    if unexpected:
        details.append(f"{len(unexpected)} weight(s) the model lacks, e.g. {', '.join(unexpected[:3])}")
    raise CheckpointError(
        f"{source} does not fit the model ({model.__class__.__name__}): {'; '.join(details)}. "
        f"It was saved for another architecture or configuration; pass the matching --model and --model-kwargs"
    )


def _checkpoint_filter_fn(model: nn.Module) -> Optional[Callable[..., dict[str, torch.Tensor]]]:
    """The ``checkpoint_filter_fn`` of the model's timm module (it translates foreign checkpoints), if any."""
    module = sys.modules.get(type(model).__module__)
    return getattr(module, "checkpoint_filter_fn", None)


def _fits(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``state`` has exactly the keys and shapes of ``expected`` (a model's state dict)."""
    return expected.keys() == state.keys() and all(tuple(state[k].shape) == tuple(v.shape) for k, v in expected.items())


def load_weights(
    model: nn.Module,
    checkpoint: str | os.PathLike | Mapping[str, Any],
    use_ema: bool = False,
    source: Optional[str] = None,
    ignore_classifier: bool = False,
) -> list[str]:
    """Load weights of any format we know into ``model``: the one loader of every entry point.

    ``checkpoint`` is a path (``.pt``/``.pth``/``.bin`` read with ``weights_only``, or
    ``.safetensors``) or an already-read dict: our ``last.pt``/``best.pt``, the authors' training
    checkpoints and Hub files, timm/DeiT checkpoints, or a bare state dict, wrapped by DDP or
    ``torch.compile`` or not. Weights that do not fit as they are go through the model's timm
    ``checkpoint_filter_fn``, which translates foreign layouts (the authors' keys, for WeightFormer).
    With ``ignore_classifier``, a classifier of another size is left as initialised (fine-tuning on
    other classes). Returns the names of the weights left as initialised; raises
    :class:`CheckpointError` naming whatever else does not fit.
    """
    source = source or (str(checkpoint) if not isinstance(checkpoint, Mapping) else "checkpoint")
    ckpt = checkpoint if isinstance(checkpoint, Mapping) else read_checkpoint(checkpoint)
    state = strip_wrapper_prefixes(model_state_from(ckpt, use_ema, source=source))
    expected = model.state_dict()
    filter_fn = _checkpoint_filter_fn(model)
    if not _fits(expected, state) and filter_fn is not None:
        try:
            translated = filter_fn(dict(state), model)
        except (KeyError, ValueError, RuntimeError, AttributeError, IndexError):
            translated = None  # not a layout this filter knows: report the mismatch of the original keys
        if translated is not None and (_fits(expected, translated) or ignore_classifier):
            state = translated
    kept: list[str] = []
    if ignore_classifier:
        classifier = getattr(model, "pretrained_cfg", {}).get("classifier", "head")
        kept = [k for k in expected if k.startswith(f"{classifier}.")
                and (k not in state or tuple(state[k].shape) != tuple(expected[k].shape))]
        state = {k: v for k, v in state.items() if k not in kept and not (k.startswith(f"{classifier}.") and k not in expected)}
        state.update({k: expected[k] for k in kept})
    load_model_state(model, state, source=source)
    return kept


def load_backbone_weights(
    model: nn.Module, backbone_path: str, model_name: str, checkpoint: Mapping[str, Any], source: str
) -> str:
    """Load a classifier's weights (``checkpoint``, already read, any format :func:`load_weights`
    knows: ours, the authors', timm/DeiT) into the timm backbone at ``backbone_path`` inside a dense
    model; its classifier is dropped and everything outside the backbone keeps its initialisation.
    ``model_name`` is the backbone's timm name, checked against a checkpoint of ours. Returns what was
    loaded, as a clause of the run's announcement."""
    meta = checkpoint.get("meta") if isinstance(checkpoint.get("meta"), Mapping) else {}
    if meta.get("model") not in (None, model_name):
        raise CheckpointError(f"{source} holds a {meta['model']}, and this run's backbone is {model_name}; "
                              f"pass --model {meta['model']} (with its model kwargs) or another checkpoint")
    load_weights(model.get_submodule(backbone_path), checkpoint, source=source, ignore_classifier=True)
    return f"; only its backbone ({model_name}): the neck and heads start fresh"
