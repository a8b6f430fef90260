"""The training loop: data, model, optimizer, then per step forward, backward, clip, step, log, checkpoint.

Built from timm's parts: ``create_transform``/``Mixup`` for data, ``create_optimizer_v2`` (AdamW,
no weight decay on norms and biases), ``create_scheduler_v2`` (cosine with warm-up, updated every
step), ``SoftTargetCrossEntropy``/``LabelSmoothingCrossEntropy``, ``ModelEmaV3`` and
``dispatch_clip_grad``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import timm
import torch
import yaml
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, dispatch_clip_grad
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from ..checkpoint import CheckpointError, save_atomic
from ..data import ArrayImageDataset, ResumableSampler, SeededTransformDataset, build_transforms, open_dataset, precompute
from .config import TrainConfig, resolve_config
from .distributed import DistInfo, all_gather_objects, all_reduce_sum, any_rank, init_distributed, shutdown_distributed
from .errors import ConfigError
from .evaluate import autocast, evaluate
from .metrics import Progress, append_metrics, format_duration, plot_curves, truncate_metrics
from .state import build_model, capture_rng, load_model_state, read_checkpoint, restore_rng

__all__ = ["StopFlag", "TrainResult", "prepare_config", "train"]


@dataclass
class TrainResult:
    """How a run ended."""

    output: str
    best_top1: Optional[float]  # None if no evaluation ran
    best_epoch: Optional[int]
    last_checkpoint: str
    best_checkpoint: Optional[str]
    global_step: int
    stopped_by: Optional[str] = None  # "SIGINT"/"SIGTERM" when a signal ended the run early
    eval_command: str = ""
    model: Optional[nn.Module] = field(default=None, repr=False)  # the trained model (unwrapped)


class StopFlag:
    """Set by SIGINT/SIGTERM (or by code); the loop finishes its step, saves, and returns.

    A second signal while stopping raises KeyboardInterrupt, for when saving itself hangs.
    """

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self._previous: dict[int, Any] = {}

    def set(self, name: str = "stop") -> None:
        self.signal_name = name

    def __bool__(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame: Any) -> None:
        if self:
            raise KeyboardInterrupt
        self.set(signal.Signals(signum).name)
        print(f"\n{self.signal_name} received: finishing this step and saving a checkpoint "
              f"(send it again to abort without saving)", flush=True)

    def install(self) -> None:
        """Handle SIGINT and SIGTERM (only possible in the main thread; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _setup_determinism(cfg: TrainConfig, dist_info: DistInfo) -> None:
    """Seed every generator (offset by rank, so ranks draw different masks) and pin the algorithms."""
    seed = cfg.seed + dist_info.rank
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    elif dist_info.device.type == "cuda":
        torch.backends.cudnn.benchmark = True


def _model_kwargs(cfg: TrainConfig, img_size: int) -> dict[str, Any]:
    """The user's kwargs, plus img_size for models whose position embeddings fix it (ViT, DeiT, WeightFormer)."""
    kwargs = dict(cfg.model_kwargs)
    if not timm.is_model(cfg.model):
        raise ConfigError(f"unknown timm model {cfg.model!r}; list names with timm.list_models('*{cfg.model[:6]}*')")
    pretrained_cfg = timm.models.get_pretrained_cfg(cfg.model)
    takes_img_size = cfg.model.startswith("weightformer") or (pretrained_cfg is not None and pretrained_cfg.fixed_input_size)
    if takes_img_size:
        kwargs.setdefault("img_size", img_size)
    return kwargs


def _default_output(cfg: TrainConfig) -> str:
    return f"runs/{Path(cfg.data).name}_{cfg.model}"


def _check_input_size(model: nn.Module, meta: Mapping[str, Any], device: torch.device) -> None:
    """One eval-mode forward of a blank image, so a model that cannot take this size fails with one line."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.zeros(1, meta["in_chans"], meta["img_size"], meta["img_size"], device=device))
    except (RuntimeError, ValueError, AssertionError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"{meta['model']} cannot take {meta['img_size']} px images ({reason}); "
            f"pass a larger --img-size or model kwargs that fit (e.g. a smaller patch_size)"
        ) from exc
    model.train(was_training)


def _resume_path(cfg: TrainConfig) -> Optional[Path]:
    """The checkpoint to resume from: ``--resume PATH``, or ``last.pt`` in the output folder for auto."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        path = Path(cfg.output) / "last.pt"
        return path if path.is_file() else None
    path = Path(cfg.resume)
    if not path.is_file():
        raise CheckpointError(f"--resume {path}: no such file; pass an existing last.pt, or --resume auto")
    return path


def _save_config(cfg: TrainConfig, output: Path) -> None:
    (output / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def prepare_config(
    overrides: Mapping[str, Any] | None = None, config_file: Optional[str] = None
) -> tuple[TrainConfig, dict[str, Any]]:
    """:func:`resolve_config`, with the default output folder filled in and, when resuming, the
    checkpoint's own config as the base layer (so ``--resume auto`` alone continues the same run).
    """
    cfg, applied = resolve_config(overrides, config_file)
    cfg.output = cfg.output or _default_output(cfg)
    resume_from = _resume_path(cfg)
    if resume_from is not None:
        saved = read_checkpoint(str(resume_from)).get("config")
        cfg, applied = resolve_config(overrides, config_file, checkpoint_config=saved)
        cfg.output = cfg.output or _default_output(cfg)
    return cfg, applied


def train(
    config: TrainConfig | Mapping[str, Any],
    config_file: Optional[str] = None,
    stop: Optional[StopFlag] = None,
) -> TrainResult:
    """Train a model as ``config`` says; returns where the checkpoints are and the best accuracy.

    ``config`` is a :class:`TrainConfig`, or a mapping of its fields that is layered over the
    built-in data set's defaults and ``config_file`` (see :func:`prepare_config`). ``stop``, when
    set (by SIGINT/SIGTERM, which this handles while it runs, or by the caller), ends the run after
    the current step with a checkpoint. Works as one process or under torchrun.
    """
    if isinstance(config, TrainConfig):
        cfg, applied = config, {}
        if cfg.output is None:
            cfg = dataclasses.replace(cfg, output=_default_output(cfg))
    else:
        cfg, applied = prepare_config(config, config_file)
    dist_info = init_distributed(cfg.device)
    stop = stop if stop is not None else StopFlag()
    stop.install()
    try:
        if applied and dist_info.is_main:
            shown_kwargs = applied.pop("model_kwargs", {})
            model_first = {"model": applied.pop("model")} if "model" in applied else {}
            shown = " ".join(f"{k}={v}" for k, v in {**model_first, **shown_kwargs, **applied}.items())
            print(f"defaults for small images ({cfg.data}): {shown} (override with flags or --config)")
        return _train(cfg, dist_info, stop)
    finally:
        stop.uninstall()
        shutdown_distributed(dist_info)


def _train(cfg: TrainConfig, dist_info: DistInfo, stop: StopFlag) -> TrainResult:
    main = dist_info.is_main
    device = dist_info.device
    output = Path(cfg.output)
    resume_from = _resume_path(cfg)
    ckpt = read_checkpoint(str(resume_from)) if resume_from else None
    if cfg.amp == "fp16" and device.type != "cuda":
        raise ConfigError("--amp fp16 needs a GPU; use --amp bf16 (or none) on CPU")
    _setup_determinism(cfg, dist_info)

    # ---------------------------------------------------------------------------------------------
    # Data
    # ---------------------------------------------------------------------------------------------
    info, splits = open_dataset(cfg.data, verify=cfg.verify_images, warn=main)
    img_size = cfg.img_size or 224
    train_tf, val_tf = build_transforms(
        img_size, info.mean, info.std, train_scale=cfg.train_scale, hflip=cfg.hflip, color_jitter=cfg.color_jitter,
        auto_augment=cfg.auto_augment, reprob=cfg.reprob, interpolation=cfg.interpolation, crop_pct=cfg.crop_pct,
        no_aug=cfg.no_aug,
    )
    train_set: Dataset = SeededTransformDataset(splits["train"], train_tf, seed=cfg.seed)
    val_set: Dataset = SeededTransformDataset(splits["val"], val_tf)
    if isinstance(splits["train"], ArrayImageDataset):  # small and in memory: transform once, not every epoch
        val_set = precompute(val_set)
        train_set = precompute(train_set) if cfg.no_aug else train_set
    train_sampler = ResumableSampler(len(train_set), dist_info.world_size, dist_info.rank, shuffle=True, seed=cfg.seed)
    val_sampler = ResumableSampler(len(val_set), dist_info.world_size, dist_info.rank, shuffle=False, pad=False)
    steps_per_epoch = train_sampler.shard_size // cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(
            f"batch size {cfg.batch_size} is larger than the {train_sampler.shard_size} training images per process; "
            f"lower --batch-size"
        )
    loader_args = dict(num_workers=min(cfg.workers, os.cpu_count() or 1), pin_memory=device.type == "cuda")
    # Private generators: building loader iterators must not draw from the global RNG (exact resume).
    train_loader = DataLoader(train_set, batch_size=cfg.batch_size, sampler=train_sampler, drop_last=True,
                              generator=torch.Generator(), **loader_args)
    val_loader = DataLoader(val_set, batch_size=cfg.batch_size, sampler=val_sampler, generator=torch.Generator(),
                            **loader_args)

    # ---------------------------------------------------------------------------------------------
    # Model, optimizer, schedule, loss
    # ---------------------------------------------------------------------------------------------
    meta = {
        "model": cfg.model, "model_kwargs": _model_kwargs(cfg, img_size), "num_classes": info.num_classes,
        "in_chans": info.in_chans, "img_size": img_size, "data": info.name, "classes": list(info.classes),
        "mean": list(info.mean), "std": list(info.std), "interpolation": cfg.interpolation, "crop_pct": cfg.crop_pct,
    }
    model = build_model(meta).to(device)
    _check_input_size(model, meta, device)
    world_batch = cfg.batch_size * dist_info.world_size
    lr = cfg.lr * world_batch / 512
    optimizer = create_optimizer_v2(model, opt=cfg.opt, lr=lr, weight_decay=cfg.weight_decay)
    scheduler, _ = create_scheduler_v2(
        optimizer, sched="cosine", num_epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs, min_lr=cfg.min_lr,
        warmup_lr=cfg.warmup_lr, step_on_epochs=False, updates_per_epoch=steps_per_epoch,
    )
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp == "fp16")
    ema = ModelEmaV3(model, decay=cfg.ema_decay) if cfg.ema else None
    mixup = None
    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.smoothing,
                      num_classes=info.num_classes)
        criterion: nn.Module = SoftTargetCrossEntropy()  # Mixup returns smoothed soft targets
    elif cfg.smoothing > 0:
        criterion = LabelSmoothingCrossEntropy(smoothing=cfg.smoothing)
    else:
        criterion = nn.CrossEntropyLoss()

    # ---------------------------------------------------------------------------------------------
    # Resume
    # ---------------------------------------------------------------------------------------------
    start_epoch, step_in_epoch, global_step = 0, 0, 0
    progress_state = {"loss_sum": 0.0, "samples": 0, "seconds": 0.0, "best_top1": None, "best_epoch": None}
    if ckpt is not None:
        old = ckpt.get("meta") or {}
        if old.get("model") not in (None, cfg.model):
            raise CheckpointError(f"{resume_from} is a {old['model']} checkpoint, this run builds {cfg.model}; "
                                  f"pass --model {old['model']} or a new --output")
        load_model_state(model, ckpt["model"], source=str(resume_from))
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        if ema is not None and ckpt.get("ema") is not None:
            ema.load_state_dict(ckpt["ema"])
        elif ema is not None:
            ema.set(model)
        start_epoch, step_in_epoch, global_step = ckpt["epoch"], ckpt["step_in_epoch"], ckpt["global_step"]
        progress_state.update(ckpt["progress"])
        rng = ckpt["rng"]
        if len(rng) == dist_info.world_size:
            restore_rng(rng[dist_info.rank])
        elif main:
            print(f"note: {resume_from} was saved by {len(rng)} process(es), this run has {dist_info.world_size}; "
                  f"random streams restart from the seed, so the run will not match an uninterrupted one exactly")
        if step_in_epoch > steps_per_epoch:
            raise CheckpointError(
                f"{resume_from} stopped at step {step_in_epoch} of an epoch that now has {steps_per_epoch} steps; "
                f"resume with the batch size and number of processes it was saved with"
            )

    train_model: nn.Module = model
    if cfg.compile:
        train_model = torch.compile(train_model)
    if dist_info.distributed:
        train_model = DistributedDataParallel(train_model, device_ids=[device.index] if device.type == "cuda" else None)

    # ---------------------------------------------------------------------------------------------
    # Output directory
    # ---------------------------------------------------------------------------------------------
    metrics_path, last_path, best_path = output / "metrics.jsonl", output / "last.pt", output / "best.pt"
    if main:
        output.mkdir(parents=True, exist_ok=True)
        _save_config(cfg, output)
        if ckpt is not None:
            truncate_metrics(metrics_path, start_epoch)
        elif metrics_path.exists():
            metrics_path.unlink()  # a fresh run in an old directory
        n_params = sum(p.numel() for p in model.parameters())
        kwargs = "".join(f"{k}={v} " for k, v in meta["model_kwargs"].items())
        print(f"model {cfg.model} ({kwargs}{n_params / 1e6:.2f}M parameters), {info.num_classes} classes")
        print(f"data {info.name}: {len(train_set)} train / {len(val_set)} val images at {img_size} px; "
              f"{dist_info.world_size} process(es) on {device.type}, batch {cfg.batch_size} per process "
              f"(total {world_batch}), lr {cfg.lr:g} x {world_batch}/512 = {lr:.3g}, {cfg.epochs} epochs "
              f"of {steps_per_epoch} steps")
        if cfg.warmup_epochs >= cfg.epochs:
            print(f"note: warmup_epochs ({cfg.warmup_epochs}) >= epochs ({cfg.epochs}): the learning rate only warms up")
        if cfg.resume == "auto" and ckpt is None:
            print(f"no checkpoint in {output} to resume from; starting a new run")
        if ckpt is not None:
            print(f"resumed from {resume_from} at epoch {start_epoch + 1}, step {step_in_epoch} "
                  f"(global step {global_step})")
        print(f"writing to {output}", flush=True)

    def checkpoint_state(epoch: int, steps_done: int) -> dict[str, Any]:
        rng = all_gather_objects(capture_rng(), dist_info)  # every rank's streams, for exact resume
        return {
            "model": model.state_dict(), "ema": ema.state_dict() if ema is not None else None,
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "epoch": epoch, "step_in_epoch": steps_done, "global_step": global_step,
            "progress": dict(progress_state), "rng": rng, "meta": meta, "config": cfg.to_dict(),
        }

    def evaluate_and_log(epoch: int, partial: bool) -> dict[str, Any]:
        result = evaluate(model, val_loader, device, cfg.amp, dist_info)
        totals = all_reduce_sum(torch.tensor([progress_state["loss_sum"], float(progress_state["samples"])],
                                             dtype=torch.float64, device=device), dist_info)
        record = {
            "epoch": epoch + 1, "step": global_step, "train_loss": totals[0].item() / max(totals[1].item(), 1),
            "val_loss": result["loss"], "val_top1": result["top1"], "val_top5": result["top5"],
            "lr": optimizer.param_groups[0]["lr"],
            "img_per_s": totals[1].item() / max(progress_state["seconds"], 1e-9), "world_size": dist_info.world_size,
        }
        if ema is not None:
            ema_result = evaluate(ema.module, val_loader, device, cfg.amp, dist_info)
            record.update(val_top1_ema=ema_result["top1"], val_top5_ema=ema_result["top5"])
        if partial:
            record["partial"] = True
        return record

    # ---------------------------------------------------------------------------------------------
    # Loop
    # ---------------------------------------------------------------------------------------------
    total_steps = cfg.epochs * steps_per_epoch if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * steps_per_epoch)
    progress = Progress(main, cfg.log_interval, total_steps, global_step)
    stopped_by: Optional[str] = None
    epoch = start_epoch
    while epoch < cfg.epochs and global_step < total_steps:
        train_sampler.set_epoch(epoch, start=step_in_epoch * cfg.batch_size)
        if isinstance(train_set, SeededTransformDataset):
            train_set.set_epoch(epoch)
        train_model.train()
        progress.start_epoch(epoch, cfg.epochs, steps_per_epoch, step_in_epoch)
        tick = time.perf_counter()
        for images, targets in train_loader:
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            if mixup is not None:
                images, targets = mixup(images, targets)  # targets: (B,) -> (B, num_classes) soft labels
            with autocast(device, cfg.amp):
                loss = criterion(train_model(images), targets)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if cfg.clip_grad is not None:
                scaler.unscale_(optimizer)
                dispatch_clip_grad(model.parameters(), cfg.clip_grad)
            scaler.step(optimizer)
            scaler.update()
            global_step += 1
            step_in_epoch += 1
            scheduler.step_update(num_updates=global_step)
            if ema is not None:
                ema.update(model, step=global_step)

            loss_value = loss.item()
            now = time.perf_counter()
            progress_state["loss_sum"] += loss_value * images.shape[0]
            progress_state["samples"] += images.shape[0]
            progress_state["seconds"] += now - tick
            progress.step(step_in_epoch, global_step, loss_value, optimizer.param_groups[0]["lr"],
                          images.shape[0] * dist_info.world_size / max(now - tick, 1e-9))
            tick = now
            if any_rank(bool(stop), dist_info):
                stopped_by = stop.signal_name or "another rank's signal"
                break
            if global_step >= total_steps:
                break
        progress.end_epoch()

        if stopped_by is not None:  # save where the run stands; a resumed run evaluates this epoch at its end
            state = checkpoint_state(epoch, step_in_epoch)
            if main:
                save_atomic(state, last_path)
            break

        epoch_done = step_in_epoch == steps_per_epoch

        record = evaluate_and_log(epoch, partial=not epoch_done)
        improved = progress_state["best_top1"] is None or record["val_top1"] > progress_state["best_top1"]
        if improved:
            progress_state.update(best_top1=record["val_top1"], best_epoch=epoch + 1)
        next_epoch, next_step = (epoch + 1, 0) if epoch_done else (epoch, step_in_epoch)
        state = checkpoint_state(next_epoch, next_step)
        if epoch_done:
            progress_state.update(loss_sum=0.0, samples=0, seconds=0.0)
            state["progress"] = dict(progress_state)
        if main:
            append_metrics(metrics_path, record)
            save_atomic(state, last_path)
            if improved:
                save_atomic({k: state[k] for k in ("model", "ema", "meta", "config", "epoch", "global_step")}
                            | {"val_top1": record["val_top1"], "val_top5": record["val_top5"]}, best_path)
            plot_curves(metrics_path, output / "curves.png")
            ema_text = f" (EMA {record['val_top1_ema']:.2f}%)" if ema is not None else ""
            progress.write(
                f"epoch {epoch + 1}/{cfg.epochs}: train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f}, "
                f"top-1 {record['val_top1']:.2f}%{ema_text}, top-5 {record['val_top5']:.2f}%, "
                f"{record['img_per_s']:.0f} img/s, elapsed {format_duration(time.perf_counter() - progress.run_start)}"
            )
        epoch, step_in_epoch = next_epoch, next_step

    best = progress_state["best_top1"]
    eval_command = f"weightformer eval --checkpoint {best_path if best is not None else last_path}"
    result = TrainResult(
        output=str(output), best_top1=best, best_epoch=progress_state["best_epoch"], last_checkpoint=str(last_path),
        best_checkpoint=str(best_path) if best is not None else None, global_step=global_step,
        stopped_by=stopped_by, eval_command=eval_command, model=model,
    )
    if main:
        if stopped_by is not None:
            print(f"stopped by {stopped_by} at epoch {epoch + 1}, step {step_in_epoch} (global step {global_step}); "
                  f"checkpoint saved to {last_path}\nresume with: weightformer train --output {output} --resume auto")
        else:
            if best is not None:
                print(f"done: best top-1 {best:.2f}% at epoch {progress_state['best_epoch']}, checkpoint {best_path}")
            print(f"last checkpoint {last_path}; metrics {metrics_path}; curves {output / 'curves.png'}")
            print(f"evaluate with: {eval_command}", flush=True)
    return result
