"""A fifth task in one module: count the bright blobs in grayscale images (regression).

Everything the engine does not know about this task is here, and nothing under ``src/`` names it:
its settings (:class:`BlobsConfig`), its recipes, its data (generated images, or a folder of yours),
its model (:class:`BlobNet`, which predicts a density map and sums it), its loss and metrics, its
library functions (:func:`evaluate_checkpoint`, :func:`predict`) and the ``eval`` and ``predict``
commands that are thin layers over them. The engine gives it training, checkpoints, exact resume,
torchrun, ``metrics.jsonl`` and the command line. docs/tasks.md walks through it.

Run it as a script (``train`` is built from :class:`BlobsConfig` and the recipes)::

    python tests/fifth_task.py train --output runs/blobs            # generated images, ~1 min on a CPU
    python tests/fifth_task.py eval --checkpoint runs/blobs/best.pt
    python tests/fifth_task.py predict --checkpoint runs/blobs/best.pt image.png more_images/
    torchrun --nproc_per_node=2 tests/fifth_task.py train --output runs/blobs2 --device cpu

Your own data: ``DATA/train/<count>/*.png`` and ``DATA/val/<count>/*.png``, each folder named by
the number of blobs in its images (``--data DATA``; the small-data recipe applies).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from weightformer.checkpoint import CheckpointError
from weightformer.data import DataError, SeededTransformDataset
from weightformer.data.folder import IMG_EXTENSIONS, scan_split
from weightformer.data.images import image_paths, read_image
from weightformer.engine import (
    Command, ConfigError, DistInfo, Recipe, RecipeChoice, Task, TaskCLI, TaskData, TrainConfig, autocast, load_model,
    pick_device, register_task, setting,
)
from weightformer.engine import cli
from weightformer.engine.distributed import all_reduce_sum
from weightformer.engine.errors import is_signature_error
from weightformer.engine.recipes import count_files

__all__ = [
    "BlobNet", "BlobsConfig", "BlobsTask", "Prediction", "evaluate_checkpoint", "generate_blobs", "main",
    "open_blobs", "predict",
]

BUILTIN = "blobs"  # --data blobs: images generated on the fly, the same for every run
SIZE = 32  # pixels: the recipes' resolution, and that of generated images


# -------------------------------------------------------------------------------------------------
# Settings: the engine's, plus this task's own section
# -------------------------------------------------------------------------------------------------
@dataclass
class BlobsConfig(TrainConfig):
    """A blob-counting run: generated images (``--data blobs``) or a folder of counted images."""

    data: str = setting(BUILTIN, help="blobs (generated images), or a folder with train/<count>/ and "
                                      "val/<count>/ holding the images that show <count> blobs")
    model: str = setting("blobnet", help="the model: blobnet (a density-map counter)")
    max_blobs: int = setting(5, help="most blobs in a generated image (--data blobs)")
    synthetic_images: int = setting(1000, help="training images generated for --data blobs (and a quarter as many "
                                               "for validation)")

    RULES: ClassVar[tuple[tuple[str, Callable[[Any], bool], str], ...]] = (
        ("max_blobs", lambda v: 1 <= v <= 12, "from 1 to 12 (more do not fit apart in an image)"),
        ("synthetic_images", lambda v: v >= 8, "at least 8"),
    )

    def check(self) -> None:
        super().check()
        if self.model not in MODELS:
            raise ConfigError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.data == BUILTIN and (self.img_size or SIZE) < 16:
            raise ConfigError(f"img_size must be at least 16 for generated blobs, got {self.img_size}")


# -------------------------------------------------------------------------------------------------
# Recipes: the generated data's, and one for a folder of yours
# -------------------------------------------------------------------------------------------------
# Measured on one CPU core: 15 epochs (about a minute) reach a validation MAE of 0.16 blobs, where
# predicting the mean count scores 1.5. (The model is tiny: a high learning rate suits it.)
OFFLINE = Recipe("offline", "generated 32 px blobs: blobnet width 16, batch 32, 15 epochs, lr 0.3 per 512", {
    "img_size": SIZE, "model": "blobnet", "model_kwargs": {"width": 16, "depth": 3}, "epochs": 15, "batch_size": 32,
    "lr": 0.3, "min_lr": 3e-3, "warmup_lr": 3e-4, "warmup_epochs": 1, "weight_decay": 0.01, "workers": 0,
})
# A folder of a few hundred images: the offline recipe (known to learn) at batch 16, so that even
# 200 images give 12 steps an epoch, for more epochs; the images are decoded by 2 worker processes.
SMALL_DATA = Recipe("small-data", "the offline recipe at batch 16 for 40 epochs, images decoded by 2 workers", {
    **OFFLINE.values, "epochs": 40, "batch_size": 16, "warmup_epochs": 2, "workers": 2,
})


def recipes() -> tuple[Recipe, ...]:
    return OFFLINE, SMALL_DATA


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """The offline recipe for generated blobs; the small-data one for a folder, whatever its size
    (this task has no full-scale recipe)."""
    if data == BUILTIN:
        return RecipeChoice(OFFLINE, "--data blobs generates its images")
    train = Path(data).expanduser() / "train"
    images = count_files(train, IMG_EXTENSIONS) if train.is_dir() else 0
    return RecipeChoice(SMALL_DATA, f"{train} holds {images} images, and a folder of any size gets the small-data "
                                    f"recipe (this task has no full-scale one)")


# -------------------------------------------------------------------------------------------------
# Data
# -------------------------------------------------------------------------------------------------
def generate_blobs(num: int, size: int = SIZE, max_blobs: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``num`` noisy dark images with 0 to ``max_blobs`` bright Gaussian blobs each, kept apart.

    Returns images (num, size, size) uint8 and counts (num,) int64. Fixed by ``seed`` alone (its own
    generator: the global random state is untouched)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)  # (size, size) each
    counts = rng.integers(0, max_blobs + 1, num)  # (num,)
    images = np.empty((num, size, size), np.uint8)
    # Centres at least `spacing` apart (no two blobs merge) and `margin` inside the border; 12 blobs
    # stay well under the ~19 that random placement can fit at these proportions, so the loop ends.
    spacing, margin = 6.0 * size / SIZE, 3.0 * size / SIZE
    for i in range(num):
        image = rng.normal(25, 8, (size, size)).astype(np.float32)  # (size, size) background noise
        centres: list[np.ndarray] = []
        while len(centres) < counts[i]:
            centre = rng.uniform(margin, size - margin, 2)  # (2,) y, x
            if all(np.hypot(*(centre - other)) >= spacing for other in centres):
                centres.append(centre)
        for cy, cx in centres:
            sigma, peak = rng.uniform(1.2, 2.0) * size / SIZE, rng.uniform(140, 220)
            image += peak * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma**2))
        images[i] = np.clip(image, 0, 255).astype(np.uint8)
    return images, counts


def read_gray(path: str | Path, size: int) -> np.ndarray:
    """An image file as (size, size) uint8 grayscale, or a one-line DataError naming it."""
    image = read_image(path).convert("L")
    if image.size != (size, size):
        image = image.resize((size, size), Image.BILINEAR)
    return np.array(image)  # a writable copy


class CountedImages(Dataset):
    """(image (H, W) uint8, count) pairs: generated arrays in memory, or files read as they are needed."""

    def __init__(self, images: Sequence[Any], counts: Sequence[int], size: int):
        self.images, self.counts, self.size = images, list(counts), size

    def __len__(self) -> int:
        return len(self.counts)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        image = self.images[index]
        return (read_gray(image, self.size) if isinstance(image, str) else image), self.counts[index]


def _folder_split(split_dir: Path, size: int, verify: bool) -> CountedImages:
    names, samples, _ = scan_split(split_dir, verify)
    bad = [name for name in names if not name.isdigit()]
    if bad:
        raise DataError(f"{split_dir / bad[0]} is not named by a count; name each folder in {split_dir} by the "
                        f"number of blobs its images show (0/, 1/, 2/, ...)")
    return CountedImages([path for path, _ in samples], [int(names[index]) for _, index in samples], size)


def open_blobs(data: str, img_size: int, max_blobs: int, synthetic_images: int,
               verify: bool = True) -> tuple[CountedImages, CountedImages, str]:
    """The train and val sets of ``data`` (``blobs``, or a folder of counted images) at ``img_size``,
    and a line describing them."""
    if data == BUILTIN:
        train = generate_blobs(synthetic_images, img_size, max_blobs, seed=0)
        val = generate_blobs(max(synthetic_images // 4, 1), img_size, max_blobs, seed=1)
        splits = CountedImages(train[0], train[1], img_size), CountedImages(val[0], val[1], img_size)
        name = f"generated blobs (0 to {max_blobs} each)"
    else:
        root = Path(data).expanduser()
        if not root.is_dir():
            raise DataError(f"--data {root} is not a folder; pass blobs, or a folder with train/<count>/ and "
                            f"val/<count>/")
        splits = _folder_split(root / "train", img_size, verify), _folder_split(root / "val", img_size, verify)
        name = str(root)
    return splits[0], splits[1], f"data {name}: {len(splits[0])} train / {len(splits[1])} val images at {img_size} px"


class ToTensor:
    """(H, W) uint8 -> (1, H, W) float in [0, 1], flipped left-right with probability ``hflip``
    (drawn from torch's generator, which :class:`SeededTransformDataset` seeds per sample)."""

    def __init__(self, hflip: float = 0.0):
        self.hflip = hflip

    def __call__(self, image: np.ndarray) -> Tensor:
        x = torch.from_numpy(np.ascontiguousarray(image)).float().div_(255).unsqueeze(0)  # (1, H, W)
        return x.flip(-1) if self.hflip > 0 and torch.rand(()).item() < self.hflip else x


def collate(batch: list[tuple[Tensor, int]]) -> tuple[Tensor, Tensor]:
    """(B, 1, H, W) images and (B,) float counts."""
    images, counts = zip(*batch)
    return torch.stack(images), torch.tensor(counts, dtype=torch.float32)


# -------------------------------------------------------------------------------------------------
# Model
# -------------------------------------------------------------------------------------------------
class BlobNet(nn.Module):
    """Dilated 3x3 convolutions to a non-negative density map; the count is its sum (any image size)."""

    def __init__(self, width: int = 16, depth: int = 3):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Conv2d(1 if i == 0 else width, width, 3, padding=2**i, dilation=2**i), nn.GELU()]
        self.features = nn.Sequential(*layers)
        self.density = nn.Conv2d(width, 1, 1)
        nn.init.constant_(self.density.bias, -6.0)  # softplus(-6) * 32 * 32 ~ 2.5 blobs at the start

    def forward(self, x: Tensor) -> Tensor:  # x: (B, 1, H, W) -> (B,) counts
        return F.softplus(self.density(self.features(x))).sum(dim=(1, 2, 3))


MODELS = {"blobnet": BlobNet}


def build_model(name: str, kwargs: Mapping[str, Any]) -> nn.Module:
    if name not in MODELS:
        raise CheckpointError(f"model {name!r} is not a blob counter; the known models are {', '.join(MODELS)}")
    try:
        return MODELS[name](**kwargs)
    except TypeError as exc:
        if is_signature_error(exc):
            raise ConfigError(f"--model-kwargs: {exc}; {name} takes width and depth") from None
        raise


# -------------------------------------------------------------------------------------------------
# Library functions: evaluation and prediction (what the commands call)
# -------------------------------------------------------------------------------------------------
@torch.no_grad()
def count_metrics(model: nn.Module, loader: DataLoader, device: torch.device, amp: str = "none",
                  dist_info: Optional[DistInfo] = None) -> dict[str, float]:
    """Loss, MAE, RMSE and the share of exactly right (rounded) counts over ``loader``, summed over ranks."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(5, dtype=torch.float64, device=device)  # loss, |error|, error², exact, images
    for images, counts in loader:
        images, counts = images.to(device), counts.to(device)  # (B, 1, H, W), (B,)
        with autocast(device, amp):
            predicted = model(images).float()  # (B,)
        error = predicted - counts
        sums += torch.stack([F.smooth_l1_loss(predicted, counts, reduction="sum"), error.abs().sum(),
                             error.square().sum(), (predicted.round() == counts).sum(),
                             torch.tensor(float(len(counts)), device=device)]).double()
    if dist_info is not None:
        sums = all_reduce_sum(sums, dist_info)
    model.train(was_training)
    n = max(sums[4].item(), 1.0)
    return {"loss": sums[0].item() / n, "mae": sums[1].item() / n, "rmse": (sums[2].item() / n) ** 0.5,
            "accuracy": sums[3].item() / n, "images": int(sums[4].item())}


def evaluate_checkpoint(checkpoint: str | Path, data: Optional[str] = None, batch_size: int = 64,
                        device: str = "cpu", use_ema: bool = False) -> dict[str, Any]:
    """The metrics of a blobs checkpoint on the validation split of ``data`` (default: its own data)."""
    loaded = load_model(checkpoint, task=BlobsTask, use_ema=use_ema, device=pick_device(device))
    meta = loaded.meta
    data = data or meta["data"]
    _, val, _ = open_blobs(data, meta["img_size"], meta["max_blobs"], meta["synthetic_images"])
    loader = DataLoader(SeededTransformDataset(val, ToTensor()), batch_size=batch_size, collate_fn=collate)
    metrics = count_metrics(loaded.model, loader, next(loaded.model.parameters()).device)
    return {"checkpoint": str(checkpoint), "data": data, **metrics}


@dataclass(frozen=True)
class Prediction:
    """One image's count."""

    path: str
    count: float  # the density map's sum
    blobs: int  # rounded


@torch.no_grad()
def predict(checkpoint: str | Path, paths: Sequence[str | Path], batch_size: int = 32, device: str = "cpu",
            use_ema: bool = False) -> list[Prediction]:
    """The number of blobs in each image file (a folder stands for every image under it), read at the
    checkpoint's resolution."""
    files = image_paths(paths)
    loaded = load_model(checkpoint, task=BlobsTask, use_ema=use_ema, device=pick_device(device))
    size, to_tensor = loaded.meta["img_size"], ToTensor()
    target = next(loaded.model.parameters()).device
    out: list[Prediction] = []
    for start in range(0, len(files), batch_size):
        chunk = files[start:start + batch_size]
        images = torch.stack([to_tensor(read_gray(file, size)) for file in chunk])  # (B, 1, size, size)
        counts = loaded.model(images.to(target)).cpu()  # (B,)
        out += [Prediction(str(f), float(c), int(c.round().item())) for f, c in zip(chunk, counts)]
    return out


# -------------------------------------------------------------------------------------------------
# The command line: thin layers over the library functions, and how runs report
# -------------------------------------------------------------------------------------------------
def _script() -> str:
    """This file, relative to the working folder when it is inside it."""
    path = Path(__file__).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _add_eval_arguments(p: argparse.ArgumentParser) -> None:
    cli.add_checkpoint_arguments(p, CLI.program)
    p.add_argument("--data", help="blobs, or a folder with val/<count>/ (default: the checkpoint's data)")
    p.add_argument("--batch-size", type=int, default=64, help="images per forward pass (default: 64)")
    cli.add_json_argument(p)


def _run_eval(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}")
    json_path = cli.json_path_argument(args)
    result = evaluate_checkpoint(args.checkpoint, args.data, args.batch_size, args.device, args.ema)
    print(f"{result['images']} images of {result['data']}: MAE {result['mae']:.3f}, RMSE {result['rmse']:.3f}, "
          f"exact {100 * result['accuracy']:.1f}%", file=sys.stderr)
    return cli.print_and_write_results(result, json_path)


def _add_predict_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH", help="image files or folders of them")
    cli.add_checkpoint_arguments(p, CLI.program)
    cli.add_json_argument(p)


def _run_predict(args: argparse.Namespace) -> int:
    json_path = cli.json_path_argument(args)
    predictions = predict(args.checkpoint, args.paths, device=args.device, use_ema=args.ema)
    for row in predictions:
        print(f"{row.path}: {row.blobs} blobs ({row.count:.2f})", file=sys.stderr)
    return cli.print_and_write_results({"predictions": [vars(row) for row in predictions]}, json_path)


COMMANDS = (
    Command("eval", "MAE, RMSE and exact-count share of a checkpoint",
            "Evaluate a blobs checkpoint on the validation images of its data (or --data): MAE, RMSE, the share "
            "of images whose rounded count is right.", _add_eval_arguments, _run_eval),
    Command("predict", "the number of blobs in image files",
            "Count the blobs in image files (folders searched recursively), read in grayscale at the checkpoint's "
            "resolution.", _add_predict_arguments, _run_predict),
)

CLI = TaskCLI(
    program=f"python {_script()}",  # not a weightformer subcommand: this module runs itself
    description="Count the bright blobs in grayscale images (regression): a task defined in one module.",
    commands=COMMANDS,
    summary=lambda m: (f"MAE {m['mae']:.3f}, RMSE {m['rmse']:.3f}, exact {100 * m['accuracy']:.1f}% "
                       f"({m['images']} images)"),
    score="MAE {:.3f}",
)


# -------------------------------------------------------------------------------------------------
# The task
# -------------------------------------------------------------------------------------------------
class BlobsTask(Task):
    """Regress the number of bright blobs in an image; ``best.pt`` is the lowest validation MAE."""

    name = "blobs"
    config_class = BlobsConfig
    recipes_module = __name__  # recipes() and choose_recipe() above
    output_prefix = "blobs_"
    best_metric = "mae"
    higher_is_better = False
    curve_metrics = ("mae", "accuracy")
    cli = CLI

    cfg: BlobsConfig

    @classmethod
    def model_from_meta(cls, meta: Mapping[str, Any]) -> nn.Module:
        return build_model(meta["model"], meta.get("model_kwargs", {}))

    def build_data(self, dist_info: DistInfo) -> TaskData:
        cfg = self.cfg
        size = cfg.img_size or SIZE
        train, val, description = open_blobs(cfg.data, size, cfg.max_blobs, cfg.synthetic_images, cfg.verify_images)
        train_set = SeededTransformDataset(train, ToTensor(0.0 if cfg.no_aug else cfg.hflip), seed=cfg.seed)
        data = cfg.data if cfg.data == BUILTIN else str(Path(cfg.data).expanduser().resolve())
        return TaskData(train_set, SeededTransformDataset(val, ToTensor()), description, collate_fn=collate,
                        meta={"img_size": size, "data": data})  # what the data tells the model's meta

    def build_model(self, data: TaskData, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
        cfg = self.cfg
        meta = {"task": self.name, "model": cfg.model, "model_kwargs": dict(cfg.model_kwargs), **data.meta,
                "max_blobs": cfg.max_blobs, "synthetic_images": cfg.synthetic_images}
        return self.model_from_meta(meta).to(device), meta

    def training_loss(self, model: nn.Module, batch: Any, device: torch.device) -> tuple[Tensor, int]:
        images, counts = (t.to(device, non_blocking=True) for t in batch)  # (B, 1, H, W), (B,)
        return F.smooth_l1_loss(model(images), counts), images.shape[0]

    def evaluate(self, model: nn.Module, loader: DataLoader, device: torch.device, amp: str,
                 dist_info: DistInfo) -> dict[str, float]:
        return count_metrics(model, loader, device, amp, dist_info)


register_task(BlobsTask)  # checkpoints say task "blobs": load_model and --resume find the task by that name


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python tests/fifth_task.py train|eval|predict ...``; returns the exit code."""
    return cli.main(BlobsTask, argv)


if __name__ == "__main__":
    sys.exit(main())
