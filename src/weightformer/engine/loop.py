"""The training loop every task shares, read top to bottom: :func:`train` resolves the config, checks the run
folder, calls :func:`build_data`, :func:`build_training`, :func:`restore` (or :func:`init_from_weights`), loops
:func:`train_one_epoch` and :func:`end_epoch`, then :func:`finish`. What differs between tasks comes from a
:class:`~.task.Task`; the rest is timm's optimizer, per-step scheduler (per-group ``lr_scale``), EMA and clipping."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import signal
import threading
import time
import warnings
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np
import torch
import yaml
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, dispatch_clip_grad
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from ..checkpoint import CheckpointError, save_atomic
from ..data.sampler import split_loader, split_sampler
from .config import (NOT_INHERITED, TrainConfig, check_layer, config_fields, load_config_file, resolve_config,
                     scaled_learning_rates, validate_config)
from .distributed import (DistInfo, all_gather_objects, all_reduce_sum, broadcast_buffers, init_distributed,
                          max_over_ranks, shutdown_distributed)
from .errors import USER_ERRORS, ConfigError, TrainingDivergedError
from .device import FP16_NEEDS_A_GPU, autocast, check_batch_fits
from .outputs import removed_if_failed, write_atomic
from .metrics import Progress, append_metrics, format_duration, plot_curves, truncate_metrics
from .run_dir import check_run_folder, hold_run_folder, start_run_folder
from .recipes import RESUMED, Recipe, RecipeChoice
from .registry import get_task
from .task import Task, TaskData
from .weights import CHECKPOINT_FORMAT, checkpoint_task, load_weights, read_checkpoint

if TYPE_CHECKING:
    from ..data import ResumableSampler, ShardStream

__all__ = ["PreparedRun", "StopFlag", "TrainResult", "prepare_config", "train"]

GIVEN = Recipe("given", "the settings of the config object passed to train()")
# What a checkpoint needs beyond the weights for a run to continue exactly where it stopped.
TRAINING_STATE_KEYS = ("optimizer", "scheduler", "scaler", "epoch", "step_in_epoch", "global_step", "progress", "rng")


@dataclass
class TrainResult:
    """How a run ended."""

    output: str
    best_metric: str  # the task's metric that picks best.pt, e.g. "top1"
    best_score: Optional[float]  # its best value; None if no evaluation ran
    best_epoch: Optional[int]
    last_checkpoint: str
    best_checkpoint: Optional[str]
    global_step: int
    stopped_by: Optional[str] = None  # "SIGINT"/"SIGTERM" when a signal ended the run early
    eval_command: str = ""
    model: Optional[nn.Module] = field(default=None, repr=False)  # the trained model (unwrapped)


@dataclass
class TrainData:
    """The task's splits, their loaders and the batch geometry of a run."""

    task_data: TaskData
    train_sampler: ResumableSampler | ShardStream  # a stream places itself in its epochs
    train_loader: DataLoader
    val_loader: DataLoader
    batch_size: int  # per process: the configured one, capped at the samples one process sees
    steps_per_epoch: int


@dataclass
class Training:
    """The model and everything that updates it."""

    model: nn.Module  # unwrapped: what checkpoints and evaluation use
    train_model: nn.Module  # compiled and/or DDP-wrapped: what the steps run
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: torch.amp.GradScaler
    ema: Optional[ModelEmaV3]
    meta: dict[str, Any]  # what rebuilds the model from a checkpoint without flags
    learning_rates: dict[str, float]  # lr, min_lr, warmup_lr after scaling by the total batch


@dataclass
class RunState:
    """Where the run stands, then its ``progress``: the running sums of the epoch and the best result so far."""

    epoch: int = 0  # index of the epoch in progress
    step_in_epoch: int = 0  # optimizer steps taken in it
    global_step: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    seconds: float = 0.0
    best_score: Optional[float] = None  # best value of the task's best_metric so far
    best_epoch: Optional[int] = None


class StopFlag:
    """Set by SIGINT/SIGTERM or code: the loop saves after its step; a second signal raises KeyboardInterrupt."""

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


def _default_output(cfg: TrainConfig, task: type[Task]) -> str:
    """``--resume PATH``: PATH's folder, the run it continues; else runs/<prefix><data>_<model>: tasks on the
    same data never share a folder."""
    if cfg.resume not in (None, "auto"):
        return str(Path(cfg.resume).parent)
    return f"runs/{task.output_prefix}{Path(cfg.data).name}_{cfg.model}"


def _resume_from(cfg: TrainConfig, task: type[Task]) -> tuple[Optional[Path], Optional[dict[str, Any]]]:
    """``--resume``'s file (auto: the output folder's ``last.pt``, if any) and its training state; or (None, None)."""
    path = None if cfg.resume is None else Path(cfg.output) / "last.pt" if cfg.resume == "auto" else Path(cfg.resume)
    if path is None or (cfg.resume == "auto" and not path.is_file()):
        return None, None
    if path.is_dir():
        raise CheckpointError(f"--resume {path} is a folder; pass --output {path} --resume auto, or its last.pt")
    if not path.is_file():
        raise CheckpointError(f"--resume {path}: no such file; pass an existing last.pt, or --resume auto")
    ckpt = read_checkpoint(path)
    checkpoint_task(ckpt, f"--resume {path}", task)
    if not all(key in ckpt for key in TRAINING_STATE_KEYS):
        raise CheckpointError(f"--resume {path}: the file holds weights only (no optimizer, schedule or step), so no "
                              f"run can continue from it; start a new run from these weights with --init {path}")
    return path, ckpt


@dataclass
class PreparedRun:
    """A run's settings, the recipe under them and why, and the checkpoint it resumes (read once)."""

    cfg: TrainConfig
    recipe: RecipeChoice
    applied: dict[str, Any]  # the recipe's values that no file or flag overrode
    resume_from: Optional[Path] = None
    checkpoint: Optional[dict[str, Any]] = field(default=None, repr=False)


def _task_class(task: type[Task] | str) -> type[Task]:
    if isinstance(task, str):
        return get_task(task)
    if not (isinstance(task, type) and issubclass(task, Task)):
        raise TypeError(f"task must be a Task subclass or a registered task name, got {task!r}")
    return task


def _applied(recipe_values: Mapping[str, Any], layers: tuple[Mapping[str, Any], ...],
             cfg: TrainConfig) -> dict[str, Any]:
    """The recipe's values that took effect: not set by a layer (and, for model kwargs, kept)."""
    applied = {k: v for k, v in recipe_values.items() if k != "model_kwargs" and not any(k in layer for layer in layers)}
    kept = {k: v for k, v in dict(recipe_values.get("model_kwargs") or {}).items() if cfg.model_kwargs.get(k) == v}
    if kept:
        applied["model_kwargs"] = kept
    return applied


def prepare_config(overrides: Mapping[str, Any] | None = None, config_file: Optional[str] = None, *,
                   task: type[Task] | str) -> PreparedRun:
    """The settings of a run of ``task`` as :func:`train` resolves them: the task's recipe for the data,
    under the ``config_file``'s values and then ``overrides`` (the flags). A resumed run's saved settings
    replace the recipe, so ``--resume auto`` alone continues the same run."""
    task = _task_class(task)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"the settings of a run are a mapping such as {{'data': 'mnist'}} or a "
                        f"{task.config_class.__name__}, got the {type(overrides).__name__} {overrides!r:.80}")
    config_class = task.config_class
    flags = check_layer(config_class, dict(overrides or {}), "the arguments")
    from_file = check_layer(config_class, load_config_file(config_file), str(config_file)) if config_file else {}
    layers = (from_file, flags)
    user = {**from_file, **flags}
    data = user.get("data") or config_fields(config_class)["data"].default
    choice = task.choose_recipe(data, user)
    cfg = resolve_config(config_class, choice.recipe.values, layers)
    cfg.output = cfg.output or _default_output(cfg, task)
    resume_from, ckpt = _resume_from(cfg, task)
    if ckpt is None:
        return PreparedRun(cfg, choice, _applied(choice.recipe.values, layers, cfg))
    saved = {k: v for k, v in (ckpt.get("config") or {}).items() if k not in NOT_INHERITED}
    # The saved settings over the recipe of the run's data (for settings newer than the checkpoint);
    # a saved mapping (model_kwargs) replaces the recipe's whole, never merged into it.
    try:
        recipe_values = task.choose_recipe(user.get("data") or saved.get("data") or data, {**saved, **user}).recipe.values
    except USER_ERRORS:  # the data moved or went: the saved settings are the run's; the data scan says what is wrong
        recipe_values = {}
    cfg = resolve_config(config_class, {**recipe_values, **saved}, layers)
    cfg.output = cfg.output or _default_output(cfg, task)
    return PreparedRun(cfg, RecipeChoice(RESUMED, f"--resume continues {resume_from}"), {}, resume_from, ckpt)


def train(config: TrainConfig | Mapping[str, Any], config_file: Optional[str] = None, stop: Optional[StopFlag] = None,
          *, task: type[Task] | str) -> TrainResult:
    """Train a model of ``task`` (a Task subclass or registered name) as ``config`` says: a mapping of settings,
    layered over the recipe and ``config_file`` as the ``train`` command layers its flags (:func:`prepare_config`),
    or a config object of the task's ``config_class``, used as it is. ``stop`` (set by SIGINT/SIGTERM or the caller)
    ends the run after the current step with a checkpoint. One process or under torchrun."""
    task = _task_class(task)
    started = time.time_ns()
    if isinstance(config, TrainConfig):
        if not isinstance(config, task.config_class):
            raise ConfigError(f"a {task.name} run needs a {task.config_class.__name__}, got a "
                              f"{type(config).__name__}; pass a mapping of settings, or build the task's config")
        cfg = validate_config(config)
        if cfg.output is None:
            cfg = dataclasses.replace(cfg, output=_default_output(cfg, task))
        prepared = PreparedRun(cfg, RecipeChoice(GIVEN, "the settings were passed as a config object"), {},
                               *_resume_from(cfg, task))
    else:
        prepared = prepare_config(config, config_file, task=task)
    cfg = prepared.cfg
    dist_info = init_distributed(cfg.device)
    stop = stop if stop is not None else StopFlag()
    stop.install()
    try:
        if dist_info.is_main:
            print(prepared.recipe.line())
            if prepared.applied:
                applied = dict(prepared.applied)
                shown_kwargs = applied.pop("model_kwargs", {})
                model_first = {"model": applied.pop("model")} if "model" in applied else {}
                shown = " ".join(f"{k}={v}" for k, v in {**model_first, **shown_kwargs, **applied}.items())
                print(f"defaults for {cfg.data}: {shown} (override with flags or --config)")
        with ExitStack() as run_folder:
            _hold_run_folder(run_folder, prepared, task, started, dist_info)
            return _run(cfg, task(cfg), dist_info, stop, prepared.resume_from, prepared.checkpoint)
    finally:
        stop.uninstall()
        shutdown_distributed(dist_info)


def _hold_run_folder(stack: ExitStack, prepared: PreparedRun, task: type[Task], started: int,
                     dist_info: DistInfo) -> None:
    """Rank 0 takes the run folder for the ``stack``'s life (:func:`hold_run_folder`) before anything checks or
    writes it. A checkpoint to resume that was saved after this run began reading it (``started``, ns; by a run
    that held the folder then) is read again; one that appeared since ``--resume auto`` found none is refused."""
    cfg, last = prepared.cfg, Path(prepared.cfg.output) / "last.pt"
    refused, level = None, 0
    if dist_info.is_main:
        stack.enter_context(removed_if_failed(Path(cfg.output)))
        try:
            stack.enter_context(hold_run_folder(Path(cfg.output)))
        except ConfigError as exc:
            refused, level = exc, 3
        else:  # 1 s: file times come from a coarser clock; reading once more costs only time
            resumed = prepared.checkpoint is not None and prepared.resume_from.is_file()
            level = (2 if cfg.resume == "auto" and prepared.checkpoint is None and last.is_file() else
                     int(resumed and prepared.resume_from.stat().st_mtime_ns > started - 10**9))
    level = max_over_ranks(level, dist_info)
    if level == 1:
        prepared.resume_from, prepared.checkpoint = _resume_from(cfg, task)
    elif level:
        raise refused or ConfigError(f"another process saved {last} while this run started; run the command again"
                                     if level == 2 else f"rank 0 could not take --output {cfg.output} (its error "
                                     f"says why)")


def _run(cfg: TrainConfig, task: Task, dist_info: DistInfo, stop: StopFlag, resume_from: Optional[Path],
         ckpt: Optional[dict[str, Any]]) -> TrainResult:
    output = Path(cfg.output)
    if cfg.amp == "fp16" and dist_info.device.type != "cuda":
        raise ConfigError(FP16_NEEDS_A_GPU)
    # A run that found no checkpoint under --resume auto may start over the files of one that never saved.
    overwrite = cfg.overwrite or (cfg.resume == "auto" and ckpt is None)
    # A run that never starts leaves no empty folder behind (the main process made it, and removes it).
    with removed_if_failed(output) if dist_info.is_main else nullcontext():
        check_run_folder(output, resuming=ckpt is not None, overwrite=overwrite)  # before the data scan
        _setup_determinism(cfg, dist_info)
        check_batch_fits(cfg.batch_size, cfg.img_size)  # an image side that cannot fit: refused before the data
        if cfg.compile:
            check_compile_backend(cfg.compile_backend)
        data = build_data(cfg, task, dist_info)
        training = build_training(cfg, task, data, dist_info)
        state = restore(ckpt, str(resume_from), task, training, data, dist_info) if ckpt is not None else RunState()
        if ckpt is not None and _branches(resume_from, output):  # this folder's best.pt is the best reached here
            state.best_score = state.best_epoch = None
        total_steps = cfg.epochs * data.steps_per_epoch
        total_steps = total_steps if cfg.max_steps is None else min(cfg.max_steps, total_steps)
        finished = ckpt is not None and (state.epoch >= cfg.epochs or state.global_step >= total_steps)
        left = (f"{resume_from} has trained {state.global_step} of the run's {total_steps} steps ({cfg.epochs} "
                f"epoch(s)), so nothing is left to train; pass a larger --epochs or --max-steps to train on")
        if finished and _branches(resume_from, output):
            raise ConfigError(f"{left} in {output}")
        if ckpt is None and cfg.init is not None:
            init_from_weights(task, training, cfg.init, dist_info)
    if cfg.compile:
        training.train_model = compiled(training.train_model, cfg.compile_backend)
    if dist_info.distributed:
        device_ids = [dist_info.device.index] if dist_info.device.type == "cuda" else None
        training.train_model = DistributedDataParallel(training.train_model, device_ids=device_ids)

    if dist_info.is_main:
        for note in start_run_folder(output, resuming=ckpt is not None, overwrite=overwrite):
            print(f"note: {note}")
        write_atomic(output / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        if ckpt is not None:
            truncate_metrics(output / "metrics.jsonl", state.epoch)
        _announce(cfg, data, training, dist_info, state, resume_from)
        if finished:
            print(f"note: {left}")

    progress = Progress(dist_info.is_main, cfg.log_interval, total_steps, state.global_step)
    stopped_by: Optional[str] = None
    try:
        while state.epoch < cfg.epochs and state.global_step < total_steps:
            stopped_by = train_one_epoch(cfg, task, data, training, state, progress, stop, total_steps, dist_info)
            if stopped_by is not None:  # save where the run stands; a resumed run evaluates this epoch at its end
                checkpoint = _checkpoint_state(training, state, cfg, dist_info)
                if dist_info.is_main:
                    save_atomic(checkpoint, output / "last.pt")
                break
            end_epoch(cfg, task, data, training, state, progress, output, dist_info)
    finally:
        progress.close()
    return finish(task, training, state, output, stopped_by, dist_info.is_main)


def check_compile_backend(backend: str) -> None:
    if backend not in torch._dynamo.list_backends(exclude_tags=()):
        raise ConfigError(f"compile_backend {backend!r} is not a torch.compile backend; use inductor (the default), "
                          f"aot_eager or another name in torch._dynamo.list_backends(exclude_tags=())")


def compiled(model: nn.Module, backend: str) -> nn.Module:
    """``torch.compile(model, dynamic=True)`` with ``backend`` (checked by :func:`check_compile_backend` before the
    data scan): one program for every image and batch size."""
    # strict_output_strides: Inductor otherwise sorts the symbolic strides of the views it saves for backward
    # with sympy, which cannot order sizes such as 96·⌊W/4⌋ against 96 ("cannot determine truth value").
    options = {"strict_output_strides": True} if backend == "inductor" else None
    return torch.compile(model, dynamic=True, backend=backend, options=options)


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


def capture_rng() -> dict[str, Any]:
    """This process's torch, CUDA, NumPy and Python generator states, as tensors and plain values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return {"torch": torch.get_rng_state(), "cuda": cuda,
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": random.getstate()}


def restore_rng(state: Mapping[str, Any]) -> None:
    """Undo :func:`capture_rng`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def build_data(cfg: TrainConfig, task: Task, dist_info: DistInfo) -> TrainData:
    """The task's splits, each process's shard and the loaders; the batch capped at one process's samples."""
    task_data = task.build_data(dist_info)
    train_sampler = split_sampler(task_data.train_set, dist_info.rank, dist_info.world_size, train=True, seed=cfg.seed)
    val_sampler = split_sampler(task_data.val_set, dist_info.rank, dist_info.world_size, train=False)
    batch_size = min(cfg.batch_size, train_sampler.shard_size)
    if batch_size < cfg.batch_size and dist_info.is_main:
        warnings.warn(f"batch size {cfg.batch_size} is larger than the {train_sampler.shard_size} training samples "
                      f"each process sees; using batch {batch_size} (the learning rate is scaled to it)")
    loader_args = dict(num_workers=min(cfg.workers, os.cpu_count() or 1), pin_memory=dist_info.device.type == "cuda",
                       collate_fn=task_data.collate_fn)
    train_loader = split_loader(task_data.train_set, train_sampler, batch_size, drop_last=True, **loader_args)
    val_loader = split_loader(task_data.val_set, val_sampler, batch_size, **loader_args)
    return TrainData(task_data, train_sampler, train_loader, val_loader, batch_size,
                     steps_per_epoch=train_sampler.shard_size // batch_size)


def build_training(cfg: TrainConfig, task: Task, data: TrainData, dist_info: DistInfo) -> Training:
    """The task's model, the optimizer (on the task's parameter groups, if any), schedule, scaler and EMA."""
    model, meta = task.build_model(data.task_data, dist_info.device)
    if cfg.grad_checkpointing:
        if not hasattr(model, "set_grad_checkpointing"):
            raise ConfigError(f"{cfg.model} does not support gradient checkpointing; drop --grad-checkpointing")
        model.set_grad_checkpointing(True)
    lrs = scaled_learning_rates(cfg, data.batch_size * dist_info.world_size)
    params = task.param_groups(model)
    optimizer = create_optimizer_v2(params if params is not None else model, opt=cfg.opt, lr=lrs["lr"],
                                    weight_decay=cfg.weight_decay)
    scheduler, _ = create_scheduler_v2(
        optimizer, sched=cfg.sched, num_epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs, min_lr=lrs["min_lr"],
        decay_milestones=list(cfg.decay_milestones), decay_rate=cfg.decay_rate, warmup_lr=lrs["warmup_lr"],
        step_on_epochs=False, updates_per_epoch=data.steps_per_epoch)
    scaler = torch.amp.GradScaler(dist_info.device.type, enabled=cfg.amp == "fp16")
    ema = ModelEmaV3(model, decay=cfg.ema_decay) if cfg.ema else None
    return Training(model=model, train_model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ema=ema,
                    meta=meta, learning_rates=lrs)


def restore(ckpt: Mapping[str, Any], source: str, task: Task, training: Training, data: TrainData,
            dist_info: DistInfo) -> RunState:
    """Put the model, optimizer, schedule, scaler, EMA, generators and position back as ``ckpt`` saved them."""
    old = ckpt.get("meta") or {}
    if old.get("model") not in (None, training.meta["model"]):
        raise CheckpointError(f"{source} is a {old['model']} checkpoint, this run builds {training.meta['model']}; "
                              f"pass --model {old['model']} or a new --output")
    task.check_checkpoint(old, training.meta, source)
    load_weights(training.model, ckpt, source=source)
    training.optimizer.load_state_dict(ckpt["optimizer"])
    training.scheduler.load_state_dict(ckpt["scheduler"])
    training.scaler.load_state_dict(ckpt["scaler"])
    if training.ema is not None and ckpt.get("ema") is not None:
        training.ema.load_state_dict(ckpt["ema"])
    elif training.ema is not None:
        training.ema.set(training.model)
    state = RunState(ckpt["epoch"], ckpt["step_in_epoch"], ckpt["global_step"], **ckpt["progress"])
    rng = ckpt["rng"]
    if len(rng) == dist_info.world_size:
        restore_rng(rng[dist_info.rank])
    elif dist_info.is_main:
        print(f"note: {source} was saved by {len(rng)} process(es), this run has {dist_info.world_size}; "
              f"random streams restart from the seed, so the run will not match an uninterrupted one exactly")
    if state.step_in_epoch > data.steps_per_epoch:
        raise CheckpointError(f"{source} stopped at step {state.step_in_epoch} of an epoch that now has "
                              f"{data.steps_per_epoch} steps; resume with the batch size and number of processes it "
                              f"was saved with")
    return state


def init_from_weights(task: Task, training: Training, path: str, dist_info: DistInfo) -> None:
    """Start a new run from the weights in ``path``, loaded by the task (the whole model, or its backbone)."""
    loaded = task.init_weights(training.model, training.meta, read_checkpoint(path), f"--init {path}")
    if training.ema is not None:
        training.ema.set(training.model)
    if dist_info.is_main:
        print(f"initialised from the weights in {path}: a new run, with a new schedule{loaded}")


def _branches(resumed_from: Path, output: Path) -> bool:
    """Whether a run resumed from ``resumed_from`` writes into another folder than the checkpoint's."""
    return resumed_from.parent.resolve() != output.resolve()


def _announce(cfg: TrainConfig, data: TrainData, training: Training, dist_info: DistInfo, state: RunState,
              resumed_from: Optional[Path]) -> None:
    world_batch = data.batch_size * dist_info.world_size
    n_params = sum(p.numel() for p in training.model.parameters())
    kwargs = "".join(f"{k}={v} " for k, v in training.meta["model_kwargs"].items())
    size = f"{n_params / 1e6:.2f}M" if n_params >= 100_000 else f"{n_params / 1e3:.1f}k"
    print(f"model {cfg.model} ({kwargs}{size} parameters)")
    print(f"{data.task_data.description}; {dist_info.world_size} process(es) on {dist_info.device.type}, "
          f"batch {data.batch_size} per process (total {world_batch}), lr {cfg.lr:g} x {world_batch}/512 = "
          f"{training.learning_rates['lr']:.3g}, {cfg.epochs} epochs of {data.steps_per_epoch} steps")
    if cfg.warmup_epochs >= cfg.epochs:
        print(f"note: warmup_epochs ({cfg.warmup_epochs}) >= epochs ({cfg.epochs}): the learning rate only warms up")
    if cfg.resume == "auto" and resumed_from is None:
        print(f"no checkpoint in {cfg.output} to resume from; starting a new run")
    if resumed_from is not None:
        print(f"resumed from {resumed_from} at epoch {state.epoch + 1}, step {state.step_in_epoch} "
              f"(global step {state.global_step})")
        if _branches(resumed_from, Path(cfg.output)):
            print(f"note: the run continues in {cfg.output}, not {resumed_from.parent}: best.pt, metrics.jsonl and "
                  f"curves.png there cover the epochs trained there")
    print(f"writing to {cfg.output}", flush=True)


# Levels of the one per-step collective that keeps the ranks together (the largest wins).
_CONTINUE, _STOP, _DIVERGED = 0, 1, 2


def train_one_epoch(cfg: TrainConfig, task: Task, data: TrainData, training: Training, state: RunState,
                    progress: Progress, stop: StopFlag, total_steps: int, dist_info: DistInfo) -> Optional[str]:
    """Optimizer steps until the epoch ends, ``total_steps`` is reached or a stop is asked for; returns the
    signal that stopped the run early, or None. TrainingDivergedError when any rank's loss is not finite."""
    device = dist_info.device
    data.train_sampler.set_epoch(state.epoch, start=state.step_in_epoch * data.batch_size)
    if hasattr(data.task_data.train_set, "set_epoch") and data.task_data.train_set is not data.train_sampler:
        data.task_data.train_set.set_epoch(state.epoch)
    training.train_model.train()
    progress.start_epoch(state.epoch, cfg.epochs, data.steps_per_epoch, state.step_in_epoch)
    stopped_by = None
    tick = time.perf_counter()
    for batch in data.train_loader:
        with autocast(device, cfg.amp):
            loss, batch_samples = task.training_loss(training.train_model, batch, device)
        training.optimizer.zero_grad(set_to_none=True)
        training.scaler.scale(loss).backward()
        if cfg.clip_grad is not None:
            training.scaler.unscale_(training.optimizer)
            dispatch_clip_grad(training.model.parameters(), cfg.clip_grad)
        training.scaler.step(training.optimizer)
        training.scaler.update()
        state.global_step += 1
        state.step_in_epoch += 1
        training.scheduler.step_update(num_updates=state.global_step)
        if training.ema is not None:
            training.ema.update(training.model, step=state.global_step)
        # One collective a step keeps the ranks together: any rank's non-finite loss or stop signal.
        loss_value = loss.item()
        level = max_over_ranks(_DIVERGED if not math.isfinite(loss_value) else _STOP if stop else _CONTINUE, dist_info)
        if level == _DIVERGED:  # nothing of this step is saved: the last checkpoint on disk stays the good one
            raise TrainingDivergedError(_divergence_message(loss_value, cfg, data, state))

        now = time.perf_counter()
        state.loss_sum += loss_value * batch_samples
        state.samples += batch_samples
        state.seconds += now - tick
        progress.step(state.step_in_epoch, state.global_step, loss_value, training.optimizer.param_groups[0]["lr"],
                      batch_samples * dist_info.world_size / max(now - tick, 1e-9))
        tick = now
        if level == _STOP:
            stopped_by = stop.signal_name or "another rank's signal"
            break
        if state.global_step >= total_steps:
            break
    progress.end_epoch()
    return stopped_by


def _divergence_message(loss_value: float, cfg: TrainConfig, data: TrainData, state: RunState) -> str:
    what = str(loss_value) if not math.isfinite(loss_value) else "non-finite on another process"
    last = Path(cfg.output) / "last.pt"
    kept = f"the last good checkpoint is {last}" if last.is_file() else "no checkpoint was saved before it"
    return (f"the loss became {what} at step {state.global_step} (epoch {state.epoch + 1}, step "
            f"{state.step_in_epoch} of {data.steps_per_epoch}), so the run stopped; {kept}. "
            f"Lower --lr, keep clip_grad on, or train with --amp none")


def _checkpoint_state(training: Training, state: RunState, cfg: TrainConfig, dist_info: DistInfo) -> dict[str, Any]:
    rng = all_gather_objects(capture_rng(), dist_info)  # every rank's streams, for exact resume
    progress = dataclasses.asdict(state)
    position = {k: progress.pop(k) for k in ("epoch", "step_in_epoch", "global_step")}
    return {"format": CHECKPOINT_FORMAT, "model": training.model.state_dict(),
            "ema": training.ema.state_dict() if training.ema is not None else None,
            "optimizer": training.optimizer.state_dict(), "scheduler": training.scheduler.state_dict(),
            "scaler": training.scaler.state_dict(), **position, "progress": progress, "rng": rng,
            "meta": training.meta, "config": cfg.to_dict()}


def _evaluation_record(task: Task, data: TrainData, training: Training, state: RunState, cfg: TrainConfig,
                       dist_info: DistInfo, partial: bool) -> dict[str, Any]:
    """One metrics.jsonl line: the task's metrics as ``val_<name>`` (and ``val_<name>_ema``), plus the loop's."""
    device = dist_info.device
    metrics = task.evaluate(training.model, data.val_loader, device, cfg.amp, dist_info)
    totals = all_reduce_sum(torch.tensor([state.loss_sum, float(state.samples)], dtype=torch.float64, device=device),
                            dist_info)
    record = {"epoch": state.epoch + 1, "step": state.global_step, "train_loss": totals[0].item() / max(totals[1].item(), 1)}
    record.update({f"val_{name}": value for name, value in metrics.items()})
    record.update(lr=training.optimizer.param_groups[0]["lr"], img_per_s=totals[1].item() / max(state.seconds, 1e-9),
                  world_size=dist_info.world_size)
    if training.ema is not None:
        ema_metrics = task.evaluate(training.ema.module, data.val_loader, device, cfg.amp, dist_info)
        record.update({f"val_{name}_ema": ema_metrics[name] for name in task.curve_metrics})
    if partial:
        record["partial"] = True
    return record


def end_epoch(cfg: TrainConfig, task: Task, data: TrainData, training: Training, state: RunState,
              progress: Progress, output: Path, dist_info: DistInfo) -> None:
    """Evaluate, then write metrics.jsonl, last.pt, best.pt (when the best metric improved) and curves.png;
    a run stopped at ``max_steps`` mid-epoch is evaluated too (partial) and its checkpoint continues it."""
    epoch_done = state.step_in_epoch == data.steps_per_epoch
    broadcast_buffers(training.model, dist_info)
    if training.ema is not None:
        broadcast_buffers(training.ema.module, dist_info)
    record = _evaluation_record(task, data, training, state, cfg, dist_info, partial=not epoch_done)
    score = record[f"val_{task.best_metric}"]
    improved = state.best_score is None or (score > state.best_score if task.higher_is_better
                                            else score < state.best_score)
    if improved:
        state.best_score, state.best_epoch = score, state.epoch + 1
    finished_epoch = state.epoch
    if epoch_done:
        state.epoch, state.step_in_epoch = state.epoch + 1, 0
        state.loss_sum, state.samples, state.seconds = 0.0, 0, 0.0
    checkpoint = _checkpoint_state(training, state, cfg, dist_info)
    if not dist_info.is_main:
        return
    append_metrics(output / "metrics.jsonl", record)
    save_atomic(checkpoint, output / "last.pt")
    if improved:
        best = {k: checkpoint[k] for k in ("format", "model", "ema", "meta", "config", "epoch", "global_step")}
        save_atomic(best | {k: v for k, v in record.items() if k.startswith("val_")}, output / "best.pt")
    plot_curves(output / "metrics.jsonl", output / "curves.png", [f"val_{name}" for name in task.curve_metrics])
    metrics = {k[len("val_"):]: v for k, v in record.items() if k.startswith("val_")}
    ema = f" (EMA {task.cli.format_score(record[f'val_{task.best_metric}_ema'])})" if training.ema is not None else ""
    progress.write(f"epoch {finished_epoch + 1}/{cfg.epochs}: train loss {record['train_loss']:.4f}, "
                   f"{task.cli.summary(metrics)}{ema}, {record['img_per_s']:.0f} img/s, "
                   f"elapsed {format_duration(time.perf_counter() - progress.run_start)}")


def finish(task: Task, training: Training, state: RunState, output: Path, stopped_by: Optional[str],
           main: bool) -> TrainResult:
    """The run's result, and (on the main process) where everything is and what to run next."""
    last_path, best_path = output / "last.pt", output / "best.pt"
    best = state.best_score
    eval_command = task.cli.next_command(best_path if best is not None else last_path)
    if main:
        if stopped_by is not None:
            print(f"stopped by {stopped_by} at epoch {state.epoch + 1}, step {state.step_in_epoch} (global step "
                  f"{state.global_step}); checkpoint saved to {last_path}\n"
                  f"resume with: {task.cli.program} train --output {output} --resume auto")
        else:
            if best is not None:
                print(f"done: best {task.cli.format_score(best)} at epoch {state.best_epoch}, checkpoint {best_path}")
            print(f"last checkpoint {last_path}; metrics {output / 'metrics.jsonl'}; curves {output / 'curves.png'}")
            print(f"evaluate with: {eval_command}", flush=True)
    return TrainResult(
        output=str(output), best_metric=task.best_metric, best_score=best, best_epoch=state.best_epoch,
        last_checkpoint=str(last_path), best_checkpoint=str(best_path) if best is not None else None,
        global_step=state.global_step, stopped_by=stopped_by, eval_command=eval_command, model=training.model,
    )
