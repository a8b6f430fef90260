"""Images per second of one classification loader worker on ImageNet-sized JPEGs: the decode of today (PIL, in
``weightformer.data.folder.rgb_loader``) against torchvision's libjpeg-turbo decoder (``torchvision.io.decode_jpeg``),
each followed by the same training transform (the recipe's, from ``weightformer.data.transforms.build_transforms``).

The JPEGs (quality 90, about 500x375, multi-scale texture, shapes and grain) are generated in a temporary folder.
One thread (as one loader worker); passes interleaved, the median of ``--repeats``, in images per second of
CPU time (the figure that holds on a loaded machine) and of wall-clock time. Also compares the outputs: the
decoded pixels, and the augmented tensors with the same random state (the loader's per-sample seeds).

    OMP_NUM_THREADS=1 python benchmarks/examples/decode.py --images 300 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch
import torchvision
from PIL import Image, ImageDraw, features
from torchvision.io import ImageReadMode, decode_jpeg, read_file

from weightformer.atomic import write_atomic
from weightformer.bench.results import machine_info
from weightformer.data.folder import rgb_loader
from weightformer.data.transforms import build_transforms, sample_seed, seeded_rng
from weightformer.engine.config import load_config_file

SIZES = ((500, 375), (375, 500), (500, 333), (500, 400))


# Octaves of the texture: (grid width, grid height) of the noise upsampled to the image, and its amplitude
# (falling with scale, as photographs' spectra do); chosen to give JPEGs of about ImageNet's mean size, ~110 kB.
OCTAVES = (((8, 6), 50), ((32, 24), 40), ((125, 94), 35), ((250, 188), 30), ((500, 375), 20))


def natural_image(rng: np.random.Generator, size: tuple[int, int]) -> Image.Image:
    """Multi-scale texture, a dozen shapes with hard edges and grain: most of the bytes in edges and texture,
    as in photographs."""
    width, height = size
    field = np.zeros((height, width, 3), np.float32)
    for (grid_w, grid_h), amplitude in OCTAVES:
        noise = rng.normal(0, 1, (grid_h, grid_w, 3)).astype(np.float32)
        field += amplitude * np.stack([np.asarray(Image.fromarray(noise[..., c], mode="F").resize(
            (width, height), Image.BICUBIC)) for c in range(3)], axis=-1)  # (H, W, 3)
    image = Image.fromarray(np.clip(128 + field, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = rng.integers(0, width), rng.integers(0, height)
        box = [x0, y0, x0 + rng.integers(10, width // 2), y0 + rng.integers(10, height // 2)]
        colour = tuple(int(c) for c in rng.integers(0, 255, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    grain = rng.normal(0, 6, (height, width, 3))
    return Image.fromarray(np.clip(np.asarray(image) + grain, 0, 255).astype(np.uint8))


def pil_decode(path: str) -> Image.Image:
    return rgb_loader(path)


def turbo_decode(path: str) -> Image.Image:
    pixels = decode_jpeg(read_file(path), mode=ImageReadMode.RGB)  # (3, H, W) uint8
    return Image.fromarray(pixels.permute(1, 2, 0).numpy())  # (H, W, 3): the transforms take PIL images


def one_pass(paths: list[str], decode, transform) -> tuple[float, float]:
    """Images per second of a worker, each image decoded and, unless ``transform`` is None, augmented: per
    second of the process's CPU time (what a worker on a core of its own gets; other jobs on the machine barely
    change it) and per second of wall-clock time."""
    start, cpu_start = time.perf_counter(), time.process_time()
    for index, path in enumerate(paths):
        image = decode(path)
        if transform is None:
            image.load()
        else:
            with seeded_rng(sample_seed(0, 0, index)):
                transform(image)
    return len(paths) / (time.process_time() - cpu_start), len(paths) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--recipe", default="configs/classification/imagenet_weightformer_t.yaml")
    parser.add_argument("--json", help="write the figures here as well")
    args = parser.parse_args()
    torch.set_num_threads(1)
    machine = machine_info()  # at the start: the load average the measurements began under
    cfg = load_config_file(args.recipe)
    train_tf, _ = build_transforms(
        cfg["img_size"], (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), train_scale=tuple(cfg["train_scale"]),
        hflip=cfg["hflip"], color_jitter=cfg["color_jitter"], auto_augment=cfg["auto_augment"], reprob=cfg["reprob"],
        interpolation=cfg["interpolation"])
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for index in range(args.images):
            path = os.path.join(folder, f"{index:04d}.jpg")
            natural_image(rng, SIZES[index % len(SIZES)]).save(path, quality=90)
            paths.append(path)
        mean_kb = sum(os.path.getsize(p) for p in paths) / len(paths) / 1024

        decoded = [np.abs(np.asarray(pil_decode(p), np.int16) - np.asarray(turbo_decode(p), np.int16)) for p in paths]
        augmented = []
        for index, path in enumerate(paths):
            outputs = []
            for decode in (pil_decode, turbo_decode):
                with seeded_rng(sample_seed(0, 0, index)):
                    outputs.append(train_tf(decode(path)))  # (3, 224, 224), normalised
            augmented.append((outputs[0] - outputs[1]).abs())
        std = torch.tensor((0.229, 0.224, 0.225)).view(3, 1, 1)  # back to 8-bit levels: x * std * 255
        levels = [d * std * 255 for d in augmented]

        pipelines = {"pil decode": (pil_decode, None), "turbo decode": (turbo_decode, None),
                     "pil + augment": (pil_decode, train_tf), "turbo + augment": (turbo_decode, train_tf)}
        rates: dict[str, list[tuple[float, float]]] = {name: [] for name in pipelines}
        for _ in range(args.repeats):
            for name, (decode, transform) in pipelines.items():
                rates[name].append(one_pass(paths, decode, transform))
    result = {
        "machine": machine, "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "torchvision": torchvision.__version__, "pillow": Image.__version__,
        "pillow_libjpeg_turbo": features.version_feature("libjpeg_turbo"),
        "images": args.images, "mean_jpeg_kb": round(mean_kb, 1), "repeats": args.repeats, "threads": 1,
        "img_per_cpu_s_median": {name: round(statistics.median(c for c, _ in r), 1) for name, r in rates.items()},
        "img_per_wall_s_median": {name: round(statistics.median(w for _, w in r), 1) for name, r in rates.items()},
        "img_per_cpu_s_all": {name: [round(c, 1) for c, _ in r] for name, r in rates.items()},
        "decode_abs_diff": {"max": int(max(d.max() for d in decoded)),
                            "mean": float(np.mean([d.mean() for d in decoded])),
                            "pixels_differing": float(np.mean([(d > 0).mean() for d in decoded]))},
        "augmented_abs_diff_8bit_levels": {"max": float(max(d.max() for d in levels)),
                                           "mean": float(torch.stack([d.mean() for d in levels]).mean()),
                                           "identical_images": int(sum(bool((d == 0).all()) for d in augmented))},
    }
    print(json.dumps(result, indent=2))
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
