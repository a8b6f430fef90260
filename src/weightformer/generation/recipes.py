"""Generation's recipes: the offline MNIST job's, DiT's for a data set of real size, and a small-data
one for a user's own ImageFolder tree, built on the offline job's settings (which learn).

DiT's recipe (batch 256, a constant 1e-4, EMA 0.9999 over 80 epochs) needs a data set of ImageNet's
kind: its EMA averages over ~10k steps, and 80 epochs at batch 256 give 30k steps only from about
100,000 images on. DiT trains from scratch, so only the training images are counted (files with an
image extension under ``train/``), not ``--init``. A smaller folder gets the offline job's settings
(a narrow WF-DiT-S/4 with a fixed σ, batch 32, AdamW 8e-3 with a cosine decay, EMA 0.99, Min-SNR
γ = 1) at an image size that fits its images, for as many epochs as give the offline job's 3,250
steps (13 to 500 epochs), and with flips. Data-loading workers start anew every epoch, so a folder of
up to 2,000 images is decoded in the training process (its epochs are short) and a larger one by 4.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any, Mapping

from ..data.builtin import BUILTIN_DATASETS
from ..engine.recipes import Recipe, RecipeChoice, count_files

__all__ = ["DIT", "FULL_SCALE_IMAGES", "OFFLINE_STEPS", "OFFLINE_VALUES", "RECIPES", "SMALL_DATA", "SMALL_EPOCHS",
           "choose_recipe", "offline_recipe", "small_data_recipe"]

FULL_SCALE_IMAGES = 100_000  # training images from which a folder gets DiT's recipe
OFFLINE_STEPS = 3_250  # the offline job's optimizer steps (13 epochs of 8,000 digits at batch 32)
SMALL_EPOCHS = (13, 500)  # the small-data recipe's epochs: at least the offline job's, at most 500
SIZE_SAMPLE = 16  # images whose size the small-data recipe reads (headers only) to choose img_size
IN_PROCESS_IMAGES = 2_000  # the small-data recipe decodes up to this many training images in the training process

# DiT's recipe, in the loop's terms: lr per total batch of 512 (2e-4 -> 1e-4 at DiT's 256), min_lr = lr
# (constant), no warm-up, no weight decay, no clipping; augmentations are the task's own (flips).
DIT = Recipe("dit", "DiT's ImageNet recipe: wf_dit_s_2 at 256 px, batch 256, AdamW 1e-4 constant, EMA 0.9999, "
                    "80 epochs (pass --vae for DiT's latent space)", dict(
    model="wf_dit_s_2", model_kwargs={}, img_size=256, epochs=80, batch_size=256, lr=2e-4, min_lr=2e-4, warmup_lr=2e-4,
    warmup_epochs=0, weight_decay=0.0, opt="adamw", clip_grad=None, ema=True, ema_decay=0.9999, hflip=0.5,
    workers=4, min_snr_gamma=None,
))
# The offline job: a narrow WF-DiT at patch 4 on the unpadded 28 px digits (a 7x7 token grid: 1.3x
# the images per second of 32 px padded, 8x8), small batches (more steps for the same compute: this
# job is step-bound), a cosine rate from 8e-3 at batch 32 (4e-3 reached 47% class accuracy instead of
# 68%; 1.6e-2 was behind after 3 epochs), an EMA of 0.99 (the job has 3,250 steps; 0.9999 averages
# over ~10k), a fixed σ (plain ε-MSE loss, no VLB term: at this scale the learned σ's VLB term
# cost class accuracy) and Min-SNR loss weights with γ = 1 (71% -> 97% class accuracy at the same
# compute, DDPM 250 at cfg 4; γ = 2: 93%, γ = 5: 88%): the high-noise steps, where class and shape
# are decided, get the model's capacity. docs/generation.md has the runs that chose each setting.
OFFLINE_VALUES: dict[str, Any] = dict(
    model="wf_dit_s_4", model_kwargs=dict(hidden_size=64, depth=6, learn_sigma=False), img_size=28, epochs=13,
    batch_size=32, lr=1.28e-1, min_lr=1.28e-2, warmup_lr=1.28e-3, warmup_epochs=0, weight_decay=0.0, opt="adamw",
    clip_grad=1.0, ema=True, ema_decay=0.99, hflip=0.0, workers=0, min_snr_gamma=1.0,
)
_OFFLINE_SUMMARY = ("the offline MNIST job: wf_dit_s_4 at width 64, depth 6, fixed sigma, batch 32, AdamW 8e-3 "
                    "cosine, EMA 0.99, Min-SNR gamma 1, 13 epochs")
# A user's small folder: the offline job's settings for natural images (flips, as DiT); img_size,
# epochs and data-loading workers are chosen for the folder (small_data_recipe).
SMALL_DATA = Recipe("small-data", "the offline job's settings (wf_dit_s_4 at width 64, depth 6, fixed sigma, "
                                  "batch 32, AdamW 8e-3 cosine, EMA 0.99, Min-SNR gamma 1) with flips, at the "
                                  "folder's image size, for about 3,250 steps", {
    **{k: v for k, v in OFFLINE_VALUES.items() if k not in ("img_size", "epochs", "workers")}, "hflip": 0.5,
})


def offline_recipe(data: str) -> Recipe:
    """The offline job's recipe for the bundled set ``data``, at that set's image size (MNIST's 28 px)."""
    spec = BUILTIN_DATASETS[data]
    summary = _OFFLINE_SUMMARY if data == "mnist" else f"{_OFFLINE_SUMMARY}, at {spec.img_size} px"
    return Recipe("offline", summary, {**OFFLINE_VALUES, "img_size": spec.img_size})


def _image_side(train: Path, vae: bool) -> tuple[int | None, int]:
    """(the median short side of the first few readable images under ``train``, or None if none is
    readable; the img_size for it): that side rounded down to a multiple of 4 (patch 4 tiles it), 16 to
    64 px; with a VAE a multiple of 32 from 64 to 256 px (its latents, 8x smaller, still give patch 4 a
    grid). 32 px when no image is readable."""
    from ..data.images import image_sizes  # PIL and torch: here, so the command line starts without them

    sides = [min(size) for size in image_sizes(train, SIZE_SAMPLE)]
    if not sides:
        return None, 32
    side = int(statistics.median(sides))
    step, low, high = (32, 64, 256) if vae else (4, 16, 64)
    return side, min(max(side // step * step, low), high)


def small_data_recipe(train: Path, images: int, settings: Mapping[str, Any]) -> tuple[Recipe, str]:
    """The small-data recipe for ``images`` training images under ``train``, and what it was chosen from:
    the image size for the images' sides (unless ``settings`` give one), the epochs that take about
    :data:`OFFLINE_STEPS` steps at the run's batch (the user's, else 32; one process), and data-loading
    workers only for more than :data:`IN_PROCESS_IMAGES` images (the loop starts them every epoch)."""
    side, img_size = _image_side(train, bool(settings.get("vae")))
    batch = min(int(settings.get("batch_size", SMALL_DATA.values["batch_size"])), max(images, 1))
    steps_per_epoch = max(images // batch, 1)
    epochs = min(max(math.ceil(OFFLINE_STEPS / steps_per_epoch), SMALL_EPOCHS[0]), SMALL_EPOCHS[1])
    workers = 0 if images <= IN_PROCESS_IMAGES else 4
    given = settings.get("img_size")
    if given is not None:
        sized = f"the img_size given, {given} px"
    else:
        sized = f"{img_size} px for its {side} px images" if side else f"{img_size} px (no image read)"
    recipe = Recipe(SMALL_DATA.name, SMALL_DATA.summary,
                    {**SMALL_DATA.values, "img_size": img_size, "epochs": epochs, "workers": workers})
    steps = "1 step" if steps_per_epoch == 1 else f"{steps_per_epoch} steps"
    return recipe, f"{sized}, {epochs} epochs of {steps} at batch {batch} (~{epochs * steps_per_epoch} steps)"


def choose_recipe(data: str, settings: Mapping[str, Any]) -> RecipeChoice:
    """See the module docstring: a bundled set's offline recipe; for a folder, by its training images."""
    from ..data.folder import IMG_EXTENSIONS  # torchvision's: here, so the command line starts without it

    if data in BUILTIN_DATASETS:
        return RecipeChoice(offline_recipe(data), f"{data} is a bundled data set")
    train = Path(data).expanduser() / "train"
    images = count_files(train, IMG_EXTENSIONS) if train.is_dir() else 0
    if images >= FULL_SCALE_IMAGES:
        return RecipeChoice(DIT, f"{train} holds {images} images, at least the {FULL_SCALE_IMAGES} of a data set of "
                                 f"real size (DiT trains from scratch: no --init is needed)")
    recipe, detail = small_data_recipe(train, images, settings)
    return RecipeChoice(recipe, f"{train} holds {images} images, fewer than the {FULL_SCALE_IMAGES} DiT's recipe "
                                f"needs (the training images count, not --init: DiT trains from scratch); {detail}")


RECIPES = (DIT, SMALL_DATA)
