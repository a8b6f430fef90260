"""The one way in for weights: :func:`load_model` reads a checkpoint of any format (ours, the authors',
timm's, safetensors) through :func:`read_checkpoint`, which brings ours to the current format
(:func:`upgrade_checkpoint`), finds its task from ``meta["task"]`` (:func:`checkpoint_task`), rebuilds the
model from the meta and loads the weights (:func:`load_weights`).

A training checkpoint holds tensors and plain values only (``torch.load(weights_only=True)``): ``format``
(:data:`CHECKPOINT_FORMAT`; absent: 0), ``model`` and ``ema`` (None without --ema) state dicts, ``optimizer``,
``scheduler``, ``scaler``, ``epoch`` (index), ``step_in_epoch`` and ``global_step`` (optimizer steps),
``progress`` (the epoch's running sums and the best result), ``rng`` (per-rank generator states), ``meta``
(what rebuilds the model without flags: task, model, kwargs, classes, ...) and ``config`` (the resolved settings).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import torch
from torch import nn

from ..checkpoint import CheckpointError, load_checkpoint_file, strip_wrapper_prefixes
from .registry import default_task, get_task

__all__ = ["CHECKPOINT_FORMAT", "LoadedModel", "check_finite_weights", "checkpoint_task", "load_model",
           "load_model_state", "load_weights", "model_state_from", "read_checkpoint", "upgrade_checkpoint", "with_missing"]

CHECKPOINT_FORMAT = 2  # what train writes as checkpoint["format"]; a checkpoint without one is of format 0
WEIGHT_KEYS = ("model", "ema", "state_dict", "model_ema", "state_dict_ema")  # where checkpoints keep their weights


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint without running pickled code (safetensors, or ``torch.load(weights_only=True)``);
    one of ours comes back in the current format (:func:`upgrade_checkpoint`)."""
    if os.path.isdir(path):
        raise CheckpointError(f"{path} is a folder, not a checkpoint file; pass a file in it such as "
                              f"{os.path.join(path, 'last.pt')}")
    obj = load_checkpoint_file(path)
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a dict of weights")
    check_finite_weights(obj, str(path))
    return upgrade_checkpoint(obj, str(path))


def check_finite_weights(checkpoint: Mapping[str, Any], source: str) -> None:
    """CheckpointError naming the first tensor of the model or EMA weights in ``checkpoint`` (or of a bare state
    dict) that holds NaN or Inf: weights that are not finite give no results, whatever reads them."""
    states = [(f"{k}.", checkpoint[k]) for k in WEIGHT_KEYS if isinstance(checkpoint.get(k), Mapping)]
    for prefix, state in states or [("", checkpoint)]:
        for name, value in state.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and not value.isfinite().all():
                counts = {"NaN": int(value.isnan().sum()), "Inf": int(value.isinf().sum())}
                what = " and ".join(f"{n} {kind}" for kind, n in counts.items() if n)
                raise CheckpointError(f"{source} holds weights that are not finite: {prefix}{name} has {what} of its "
                                      f"{value.numel()} values; use another checkpoint (saved before its run diverged)")


def upgrade_checkpoint(checkpoint: dict[str, Any], source: str) -> dict[str, Any]:
    """``checkpoint`` in the current format: the one upgrade of every older checkpoint of ours (one with a
    ``meta``; other weights are returned as they are). The loop's own keys are upgraded here, the rest by
    the checkpoint's task (:meth:`Task.upgrade_checkpoint`). A newer format is refused."""
    version = checkpoint.get("format", 0)
    if not isinstance(checkpoint.get("meta"), Mapping) or version == CHECKPOINT_FORMAT:
        return checkpoint
    if not isinstance(version, int) or not 0 <= version < CHECKPOINT_FORMAT:
        raise CheckpointError(f"{source} is a checkpoint of format {version!r}, and this weightformer reads formats "
                              f"up to {CHECKPOINT_FORMAT}; read it with the newer weightformer that wrote it")
    checkpoint = dict(checkpoint)
    if isinstance(checkpoint.get("progress"), Mapping):  # format 0 may name the best score best_<metric>
        checkpoint["progress"] = {"best_score" if k.startswith("best_") and k != "best_epoch" else k: v
                                  for k, v in checkpoint["progress"].items()}
    named = checkpoint["meta"].get("task")
    checkpoint = (get_task(named) if named else default_task()).upgrade_checkpoint(checkpoint, version)
    return {**checkpoint, "format": CHECKPOINT_FORMAT}


def with_missing(checkpoint: dict[str, Any], meta: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """``checkpoint`` with the entries of ``meta`` and ``config`` that its own meta and config lack (an upgrade step)."""
    parts = {"meta": meta, "config": config}
    return {**checkpoint, **{k: {**defaults, **checkpoint[k]} for k, defaults in parts.items()
                             if isinstance(checkpoint.get(k), Mapping)}}


def model_state_from(checkpoint: Mapping[str, Any], use_ema: Optional[bool] = False,
                     source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """The model weights in a checkpoint: ours (``model``/``ema``), timm/DeiT style, or a bare state dict.
    ``use_ema``: True takes the EMA weights (an error if there are none), None takes them if present."""
    if use_ema is None:
        use_ema = isinstance(checkpoint.get("ema"), Mapping)
    if use_ema:
        if not isinstance(checkpoint.get("ema"), Mapping):
            raise CheckpointError(f"{source} has no EMA weights (its run kept no EMA); load its raw weights "
                                  f"(without --ema)")
        return dict(checkpoint["ema"])
    for key in ("model", "state_dict", "model_ema", "state_dict_ema"):
        if isinstance(checkpoint.get(key), Mapping):
            return dict(checkpoint[key])
    return dict(checkpoint)


def load_model_state(model: nn.Module, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Copy ``state`` into ``model``, or raise :class:`CheckpointError` naming what does not match (a
    classifier of another size as a class-count mismatch, else the first differing keys)."""
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
    if stem_weight in reshaped and state[stem_weight].dim() == expected[stem_weight].dim() == 4:
        (out, chans), (model_out, model_chans) = state[stem_weight].shape[:2], expected[stem_weight].shape[:2]
        if out == model_out and chans != model_chans:  # (out, in_chans, kh, kw)
            raise CheckpointError(f"{source} takes {chans}-channel images and the model was built for {model_chans}-"
                                  f"channel images (the data's); use data with {chans} channel(s)")
    head = pretrained_cfg.get("classifier", "head") + "."
    head_weight = head + "weight"
    if head_weight in reshaped and not (missing or unexpected) and all(k.startswith(head) for k in reshaped):
        raise CheckpointError(f"{source} has {state[head_weight].shape[0]} classes, the model has "
                              f"{expected[head_weight].shape[0]}; use a checkpoint trained on this data set, or data "
                              f"with the checkpoint's classes")
    details = []
    if reshaped:
        shapes = ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(expected[k].shape)}" for k in reshaped[:3])
        details.append(f"{len(reshaped)} shape mismatch(es) (checkpoint vs model): {shapes}")
    if missing:
        details.append(f"{len(missing)} weight(s) missing from it, e.g. {', '.join(missing[:3])}")
    if unexpected:
        details.append(f"{len(unexpected)} weight(s) the model lacks, e.g. {', '.join(unexpected[:3])}")
    raise CheckpointError(f"{source} does not fit the model ({model.__class__.__name__}): {'; '.join(details)}. "
                          f"It was saved for another architecture or configuration; pass the matching --model and "
                          f"--model-kwargs")


def _mismatches(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> int:
    """How many keys of ``state`` are missing, unexpected or of another shape against ``expected`` (0: it fits)."""
    shared = expected.keys() & state.keys()
    return len(expected.keys() ^ state.keys()) + sum(tuple(state[k].shape) != tuple(expected[k].shape) for k in shared)


def load_weights(model: nn.Module, checkpoint: str | os.PathLike | Mapping[str, Any], use_ema: Optional[bool] = False,
                 source: Optional[str] = None, ignore_classifier: bool = False) -> list[str]:
    """Load weights of any format we know (a path or a read dict: ours, the authors', timm/DeiT, a bare state dict,
    wrapped by DDP or ``torch.compile`` or not) into ``model``, through its ``checkpoint_filter_fn`` if they do not
    fit as they are. ``ignore_classifier`` leaves a classifier of another size as initialised. Returns the names of
    the weights left as initialised; raises :class:`CheckpointError` naming whatever else does not fit."""
    source = source or (str(checkpoint) if not isinstance(checkpoint, Mapping) else "checkpoint")
    ckpt = checkpoint if isinstance(checkpoint, Mapping) else read_checkpoint(checkpoint)
    state = strip_wrapper_prefixes(model_state_from(ckpt, use_ema, source=source))
    expected = model.state_dict()
    # timm's checkpoint_filter_fn(state_dict, model) of the model's module translates foreign layouts
    filter_fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if _mismatches(expected, state) and filter_fn is not None:
        try:
            translated = filter_fn(dict(state), model)
        except (KeyError, ValueError, RuntimeError, AttributeError, IndexError):
            translated = None  # not a layout this filter knows: report the mismatch of the original keys
        # The translated keys when they fit (or a classifier is to be replaced), and for the error report
        # when they are closer: an authors' file one block short then names that block, not every renamed key.
        if translated is not None and (not _mismatches(expected, translated) or ignore_classifier
                                       or _mismatches(expected, translated) < _mismatches(expected, state)):
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


@dataclass
class LoadedModel:
    """A model rebuilt from a checkpoint, in eval mode, with its task, ``meta``, source and the checkpoint as read."""

    task: Any  # the Task subclass
    model: nn.Module
    meta: dict[str, Any]
    source: str
    checkpoint: dict[str, Any] = field(default_factory=dict, repr=False)


def checkpoint_task(checkpoint: Mapping[str, Any], source: str, expected: Any = None) -> Any:
    """The Task subclass of a read ``checkpoint`` (none named: ``expected``, else the default task), with
    the one "wrong task" message of every command when it is not ``expected`` (None: any)."""
    named = (checkpoint.get("meta") or {}).get("task") if isinstance(checkpoint.get("meta"), Mapping) else None
    if named is None:
        return expected if expected is not None else default_task()
    task = get_task(named)
    if expected is not None and task is not expected and task.name != expected.name:
        flag, _, path = source.partition(" ")  # source: a path, or "--resume PATH" / "--init PATH"
        path = path if flag in ("--resume", "--init") and path else source
        raise CheckpointError(f"{source} is a {task.name} checkpoint, not a {expected.name} one; use it with "
                              f"{task.cli.program} (e.g. {task.cli.next_command(Path(path))})")
    return task


def load_model(checkpoint: str | os.PathLike | None = None, task: Any = None, model: Optional[str] = None,
               model_kwargs: Optional[Mapping[str, Any]] = None, use_ema: Optional[bool] = False,
               pretrained: bool = False, device: str | torch.device = "cpu") -> LoadedModel:
    """The model in ``checkpoint`` (any file :func:`read_checkpoint` reads; weights without our ``meta`` need
    ``model``), in eval mode on ``device``: the one reader behind every command. ``task`` (a Task subclass or a name)
    is the task the caller expects; ``model`` names another architecture for the weights; ``model_kwargs`` are laid
    over the saved ones; ``use_ema`` None: EMA if any. No checkpoint, ``model`` and ``pretrained``: timm's weights."""
    expected = get_task(task) if isinstance(task, str) else task
    model_kwargs = dict(model_kwargs or {})
    if checkpoint is None:
        owner = expected or default_task()
        if not (model and pretrained):
            raise CheckpointError("nothing to load; pass --checkpoint PATH, or --model NAME --pretrained")
        meta = owner.meta_for_weights(f"{model} (pretrained)", {}, model, model_kwargs)
        net = owner.model_from_meta({**meta, "pretrained": True})
        return LoadedModel(owner, net.to(device).eval(), meta, f"{model} (pretrained)")
    source = str(checkpoint)
    ckpt = read_checkpoint(checkpoint)
    owner = checkpoint_task(ckpt, source, expected)
    meta = dict(ckpt.get("meta") or {}) if isinstance(ckpt.get("meta"), Mapping) else {}
    if model is not None and meta.get("model") not in (None, model):
        meta = {}  # another architecture was asked for: keep only the weights, which must then fit it
    if not meta.get("model"):
        meta = owner.meta_for_weights(source, model_state_from(ckpt, False, source), model, model_kwargs)
    elif model_kwargs:  # the user's model kwargs over the saved ones
        meta["model_kwargs"] = {**meta.get("model_kwargs", {}), **model_kwargs}
    net = owner.model_from_meta(meta)
    load_weights(net, ckpt, use_ema=use_ema, source=source)
    return LoadedModel(owner, net.to(device).eval(), meta, source, ckpt)

