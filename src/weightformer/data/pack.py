"""A data set written as webdataset tar shards (``weightformer data pack``), and the shards read back and checked
(``weightformer data verify``).

``OUT/<split>/<split>-000000.tar, ...`` hold ``shard_size`` samples each (the last one the rest), in an order
shuffled once with ``seed`` (an ImageFolder lists its files class by class; a stream reads shards in turn). Each
sample is ``<key>.jpg`` or ``<key>.png`` and ``<key>.cls``, the class index as text, as webdataset's writers write
an int. A JPEG or PNG file keeps its bytes; another format, and a bundled set's arrays, are written as PNG.
``OUT/_info.json`` holds the class names, the source's :class:`~weightformer.data.DataInfo` and, per split, timm's
``num_samples``, ``filenames`` and ``shard_lengths`` (so timm's webdataset reader takes it as it is) and the
samples per class.

A pack is resumable: a shard is written to a temporary name and renamed when complete, so an interrupted pack
leaves only whole shards, and running the same command again writes the missing ones. ``OUT/.pack.json`` holds
the settings and source listing of a pack in progress; a source that changed since is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
from PIL import Image

from ..atomic import write_atomic
from ..progress import progress
from .errors import DataError
from .folder import shown_names

__all__ = ["INFO_FILE", "SplitReport", "pack_dataset", "read_info", "verify_shards"]

INFO_FILE = "_info.json"  # the name timm's webdataset reader looks for first
PLAN_FILE = ".pack.json"  # a pack in progress
FORMAT = "weightformer-pack-1"
KEPT_FORMATS = {"JPEG": "jpg", "MPO": "jpg", "PNG": "png"}  # PIL's format -> the extension whose bytes are kept
IMAGE_EXTENSIONS = ("jpg", "png")


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _file_bytes(path: str) -> tuple[str, bytes]:
    """A file's own bytes if it is a JPEG or PNG (by its content, not its name); else the image as an RGB PNG."""
    from .folder import DECODE_ERRORS, rgb_loader

    try:
        data = Path(path).read_bytes()
        with Image.open(io.BytesIO(data)) as image:
            kind = KEPT_FORMATS.get(image.format or "")
        return (kind, data) if kind else ("png", _png(rgb_loader(path)))
    except DECODE_ERRORS as exc:
        raise DataError(f"cannot read image {path} ({type(exc).__name__}: {exc}); it opened when the source was "
                        "scanned, so it changed since: replace or remove it and pack again") from None


@dataclass(frozen=True)
class _Split:
    """One split of the source: its samples' labels, and each sample's image as (extension, bytes) by index."""

    name: str
    labels: list[int]
    encode: Callable[[int], tuple[str, bytes]]

    def key(self, index: int) -> str:
        return f"{self.name}_{index:08d}"  # the index in the source's sorted listing


def _split(name: str, dataset: object, digest: "hashlib._Hash") -> _Split:
    """An ImageFolder split or a bundled set's arrays as a :class:`_Split`; what identifies the source's content
    (its paths and labels; the arrays) goes into ``digest``."""
    if hasattr(dataset, "samples"):  # ImageFolderDataset: [(path, class index)]
        paths = [path for path, _ in dataset.samples]
        for path, label in dataset.samples:
            digest.update(f"{path}\t{label}\n".encode())
        return _Split(name, [label for _, label in dataset.samples], lambda index: _file_bytes(paths[index]))
    if not hasattr(dataset, "images"):
        raise DataError(f"SRC's {name} split is {type(dataset).__name__}, not images in class folders: data pack "
                        f"reads an ImageFolder tree (<split>/<class>/*) or a bundled set; --data reads shards as they are")
    images, labels = dataset.images, dataset.labels  # ArrayImageDataset: (N, H, W) uint8, (N,)
    digest.update(images.tobytes() + labels.tobytes())
    return _Split(name, labels.tolist(), lambda index: ("png", _png(Image.fromarray(images[index], "L"))))


def _write_shard(stream: io.BufferedIOBase, split: _Split, indices: Sequence[int]) -> None:
    import webdataset as wds

    writer = wds.TarWriter(stream, mtime=0)  # a fixed mtime: the same source gives the same bytes
    try:
        for index in indices:
            extension, data = split.encode(index)
            writer.write({"__key__": split.key(index), extension: data, "cls": split.labels[index]})
    except BaseException:  # (a full disk): tarfile would flush its buffer into the closed file at exit, noisily
        writer.tarstream.fileobj.closed = True
        raise
    writer.close()  # the tar's end blocks; the stream, not TarWriter's own, stays open for write_atomic


def _check_not_the_source(out: Path, source: str) -> None:
    """``out`` is not the source folder, nor holds it, nor lies inside it (where a pack would write into, or with
    ``--overwrite`` move aside, what it reads)."""
    from ..engine.errors import ConfigError
    from ..engine.outputs import check_not_an_input
    from .builtin import BUILTIN_DATASETS

    if source in BUILTIN_DATASETS:
        return
    check_not_an_input(out, [source], flag="OUT")
    if Path(source).resolve() in out.resolve().parents:
        raise ConfigError(f"OUT {out} is inside the source {source}; pass a folder outside it")


def _unfinished(out: Path) -> bool:
    """Whether ``out`` holds a pack in progress."""
    return (out / PLAN_FILE).is_file() and not (out / INFO_FILE).exists()


def _check_splits(source: str, splits: Sequence[str]) -> None:
    """Each of ``splits`` is a folder of the ImageFolder tree ``source``, or a split of the bundled set."""
    from .builtin import BUILTIN_DATASETS

    if source in BUILTIN_DATASETS:
        have = ["train", "val"]
    elif Path(source).expanduser().is_dir():
        have = sorted(p.name for p in Path(source).expanduser().iterdir() if p.is_dir() and not p.name.startswith("."))
    else:
        raise DataError(f"SRC {source} is neither a folder nor a bundled data set; pass an ImageFolder tree "
                        f"(<split>/<class>/*) or a bundled set such as mnist")
    missing = [split for split in splits if split not in have]
    if missing:
        raise DataError(f"{source} has no split {missing[0]} (it has: {', '.join(have) or 'none'}); pass --splits "
                        "with the splits to pack")


def _refuse_taken(out: Path, overwrite: bool) -> None:
    """Before the scan: ``out`` is empty or missing, or holds a pack in progress, unless ``overwrite``."""
    from ..engine.errors import ConfigError

    if overwrite or not os.path.lexists(out) or (out.is_dir() and not any(out.iterdir())) or _unfinished(out):
        return
    finished = " (a finished pack)" if (out / INFO_FILE).exists() else ""
    raise ConfigError(f"OUT {out} already exists{finished}; pass --overwrite to move it aside (never deleted), or "
                      "another OUT")


def _resumes(out: Path, plan: dict, overwrite: bool) -> bool:
    """After the scan: whether ``out`` holds this very pack unfinished; with ``overwrite`` anything there is moved
    aside (never deleted) instead; another pack in progress is refused."""
    from ..engine.errors import ConfigError
    from ..engine.outputs import move_aside

    if not os.path.lexists(out) or (out.is_dir() and not any(out.iterdir())):
        return False
    if overwrite:
        move_aside(out)
        return False
    try:
        found = json.loads((out / PLAN_FILE).read_text())
    except (OSError, ValueError):  # unreadable: not this pack's
        found = None
    if found != plan:
        raise ConfigError(f"OUT {out} holds an unfinished pack of another source or other settings (or the source "
                          f"changed since: files added or removed); run it with the same ones to finish it, or pass "
                          f"--overwrite to move it aside and start anew")
    return True


def pack_dataset(source: str, out: str | os.PathLike, shard_size: int = 1000, splits: Sequence[str] = ("train", "val"),
                 seed: int = 0, overwrite: bool = False, verbose: bool = True) -> dict:
    """Write ``source`` (an ImageFolder tree or a bundled set's name) as tar shards into ``out`` (see the module
    docstring) and return the info written to ``out/_info.json``. ``verbose``: progress and a resume line on
    stderr, and the folder scanner's warning for unreadable files (left out; listed in the info's ``skipped``)."""
    from ..engine.run_dir import check_writable_folder
    from . import open_dataset

    if shard_size < 1:
        raise DataError(f"--shard-size must be at least 1 sample, got {shard_size}")
    out = Path(out).expanduser()
    _check_not_the_source(out, source)
    _check_splits(source, splits)
    _refuse_taken(out, overwrite)
    if out.is_dir() and not overwrite:  # (empty, or a pack to resume)
        check_writable_folder(out, "OUT")
    else:
        check_writable_folder(out.parent, "the folder of OUT")
    info, datasets = open_dataset(source, splits=tuple(splits), verify=True, warn=verbose)
    digest = hashlib.sha256()
    listed = {split: _split(split, datasets[split], digest) for split in splits}
    plan = {"format": FORMAT, "source": info.name, "splits": list(splits), "shard_size": shard_size, "seed": seed,
            "content": digest.hexdigest()}
    resuming = _resumes(out, plan, overwrite)
    out.mkdir(exist_ok=True)  # (moved aside by --overwrite)
    if not resuming:
        write_atomic(out / PLAN_FILE, json.dumps(plan, indent=2) + "\n")
    result = {"format": FORMAT, "source": info.name, "classes": list(info.classes), "num_classes": info.num_classes,
              "in_chans": info.in_chans, "mean": list(info.mean), "std": list(info.std), "shard_size": shard_size,
              "seed": seed, "skipped": list(info.skipped), "splits": {}}
    for split in splits:
        labels = listed[split].labels
        order = np.random.default_rng(seed).permutation(len(labels)).tolist()
        shards = [order[start:start + shard_size] for start in range(0, len(labels), shard_size)]
        names = [f"{split}-{index:06d}.tar" for index in range(len(shards))]
        folder = out / split
        folder.mkdir(exist_ok=True)
        for stale in folder.glob(f".{split}-*.tar.*.tmp"):  # a shard being written when a pack was stopped
            stale.unlink()
        done = [(folder / name).is_file() for name in names]
        if resuming and verbose:
            print(f"resuming the pack in {out}: {sum(done)} of {len(names)} {split}/ shards already written",
                  file=sys.stderr)
        with progress(total=len(labels), desc=f"packing {split}/", unit="img", enabled=verbose) as bar:
            for name, shard, written in zip(names, shards, done):
                if not written:
                    write_atomic(folder / name, lambda stream, shard=shard: _write_shard(stream, listed[split], shard))
                bar.update(len(shard))
        counts = np.bincount(labels, minlength=info.num_classes)
        result["splits"][split] = {"name": split, "num_samples": len(labels),
                                   "filenames": [f"{split}/{name}" for name in names],
                                   "shard_lengths": [len(shard) for shard in shards],
                                   "class_counts": counts.tolist()}
    write_atomic(out / INFO_FILE, json.dumps(result, indent=2) + "\n")
    (out / PLAN_FILE).unlink()
    return result


def read_info(out: str | os.PathLike) -> dict:
    """``out/_info.json`` of a finished pack, or a one-line DataError."""
    path = Path(out).expanduser() / INFO_FILE
    if not path.is_file():
        pending = " (an unfinished pack: run the pack command again to finish it)" if (path.parent / PLAN_FILE).is_file() else ""
        raise DataError(f"{path.parent} has no {INFO_FILE}{pending}; pass the OUT folder of `weightformer data pack`")
    try:
        info = json.loads(path.read_text())
    except ValueError as exc:
        raise DataError(f"{path} is not a pack's info file ({type(exc).__name__}: {exc}); pack the data again") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        found = info.get("format") if isinstance(info, dict) else None
        raise DataError(f"{path} is {f'a pack of format {found}' if found else 'not the info of a weightformer pack'}"
                        f"; this version reads {FORMAT}: pack the data again with it")
    return info


@dataclass
class ShardCheck:
    """What one shard holds: samples, samples per class, and its faults."""

    samples: int = 0
    class_counts: list[int] = field(default_factory=list)
    truncated: bool = False
    unlabelled: int = 0  # no .cls, or one that is not a class index of the pack
    no_image: int = 0
    undecodable: list[str] = field(default_factory=list)  # keys


def _samples_of(path: str) -> Iterator[dict]:
    import webdataset as wds

    yield from wds.tarfile_samples([{"url": path}])


def check_shard(path: str, num_classes: int, decode: bool = True) -> ShardCheck:
    """Read one shard to the end: its samples counted by class; truncation, missing or bad labels, missing and
    (with ``decode``) undecodable images found."""
    from .folder import DECODE_ERRORS

    check = ShardCheck(class_counts=[0] * num_classes)
    try:
        for sample in _samples_of(path):
            check.samples += 1
            text = sample.get("cls", b"").decode("utf-8", "replace").strip()
            if text.isascii() and text.isdigit() and int(text) < num_classes:  # ("²".isdigit(); int() refuses it)
                check.class_counts[int(text)] += 1
            else:
                check.unlabelled += 1
            image = next((sample[e] for e in IMAGE_EXTENSIONS if e in sample), None)
            if image is None:
                check.no_image += 1
            elif decode:
                try:
                    with Image.open(io.BytesIO(image)) as img:
                        img.load()
                except DECODE_ERRORS:
                    check.undecodable.append(sample["__key__"])
    except (tarfile.TarError, EOFError, OSError, ValueError):  # the tar ends in the middle of a member or header
        check.truncated = True
    return check


@dataclass
class SplitReport:
    """One split read back: its counts and, against the info, what is wrong (empty when nothing is)."""

    name: str
    samples: int
    class_counts: list[int]
    shards: int
    problems: list[str]


def verify_shards(out: str | os.PathLike, decode: bool = True, workers: Optional[int] = None,
                  verbose: bool = True) -> list[SplitReport]:
    """Read every shard of the pack in ``out`` back (``workers`` processes; default: one per core, at most 8) and
    check it against ``_info.json``: shard files, samples per shard, per split and per class, labels, and with
    ``decode`` that every image decodes. One :class:`SplitReport` per split."""
    out = Path(out).expanduser()
    info = read_info(out)
    num_classes = len(info["classes"])
    workers = workers if workers is not None else min(8, os.cpu_count() or 1)
    reports = []
    for split, expected in info["splits"].items():
        listed = [out / name for name in expected["filenames"]]
        present = [path for path in listed if path.is_file()]
        unlisted = sorted(p.name for p in set((out / split).glob("*.tar")) - set(listed))
        paths = [str(p) for p in present]
        with progress(total=len(paths), desc=f"verifying {split}/", unit="shard", enabled=verbose) as bar:
            if workers > 1 and len(paths) > 1:
                with ProcessPoolExecutor(max_workers=workers) as pool:
                    checks = []
                    for check in pool.map(check_shard, paths, [num_classes] * len(paths), [decode] * len(paths)):
                        checks.append(check)
                        bar.update(1)
            else:
                checks = []
                for path in paths:
                    checks.append(check_shard(path, num_classes, decode))
                    bar.update(1)
        lengths = dict(zip(map(str, listed), expected["shard_lengths"]))
        class_counts = np.sum([c.class_counts for c in checks], axis=0, dtype=int).tolist() if checks else [0] * num_classes
        samples = sum(c.samples for c in checks)
        truncated = [Path(p).name for p, c in zip(paths, checks) if c.truncated]
        short = [Path(p).name for p, c in zip(paths, checks) if not c.truncated and c.samples != lengths[p]]
        undecodable = [key for c in checks for key in c.undecodable]
        problems = [text for count, text in [
            (len(listed) - len(present), f"{len(listed) - len(present)} shard(s) missing "
                                         f"({shown_names([p.name for p in listed if p not in present])})"),
            (len(truncated), f"{len(truncated)} truncated or unreadable tar(s) ({shown_names(truncated)})"),
            (len(short), f"{len(short)} shard(s) with another sample count than the info's ({shown_names(short)})"),
            (sum(c.unlabelled for c in checks), f"{sum(c.unlabelled for c in checks)} sample(s) without a class "
                                                f"label in 0..{num_classes - 1}"),
            (sum(c.no_image for c in checks), f"{sum(c.no_image for c in checks)} sample(s) without a .jpg or .png"),
            (len(undecodable), f"{len(undecodable)} undecodable image(s) ({shown_names(undecodable)})"),
            (len(unlisted), f"{len(unlisted)} .tar file(s) not in {INFO_FILE} ({shown_names(unlisted)})"),
            (samples != expected["num_samples"], f"{samples} samples read, the info says {expected['num_samples']}"),
            (class_counts != expected.get("class_counts", class_counts), "samples per class differ from the info's"),
        ] if count]
        reports.append(SplitReport(split, samples, class_counts, len(present), problems))
    return reports
