"""webdataset tar shards (``train/*.tar``, ``val/*.tar``; each sample a ``.jpg``/``.png`` and a ``.cls`` class
index, as webdataset's ShardWriter and timm write them), read as a stream split over ranks and loader workers.

Start-up reads each shard's tar headers and ``.cls`` labels (and, with ``verify``, checks every image as the
folder reader does): that index fixes an epoch's samples. An epoch shuffles the shard order (seed, epoch), deals
the sequence to ranks in contiguous parts, shuffles each part within windows of :data:`SHUFFLE_WINDOW` samples,
and cuts it into batches; loader worker ``w`` serves batches ``w``, ``w + W``, ... which is the order the
DataLoader collects them in. Every sample is served at most once per epoch (training leaves out the remainder
that does not fill ``world_size`` equal whole-batch parts; validation serves all); a resumed epoch skips exactly
the batches trained. timm's ``ReaderWds`` (a webdataset pipeline) deals whole shards to workers and sets an
epoch's length with ``with_epoch``, which can repeat some samples and miss others, as its comments say; here
webdataset gives the key rule (:func:`base_plus_ext`) and brace expansion, and :func:`tar_members` reads the
headers (Python's tarfile takes about 7x as long a header).
"""

from __future__ import annotations

import io
import os
import random
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, Generator, Iterator, Optional

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from ..progress import progress as progress_lines
from .errors import DataError
from .folder import DECODE_ERRORS, MAX_CLASSES, SKIPPED_SHOWN, SkippedImagesWarning, rgb_loader
from .transforms import sample_seed, seeded_rng

__all__ = ["SHUFFLE_WINDOW", "ShardIndex", "ShardStream", "is_shard_split", "open_shards", "scan_shards",
           "shard_files", "split_summary"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # a sample's image member, first found wins
SHUFFLE_WINDOW = 8192  # samples of a rank's part shuffled together (about what timm's buffer holds)
BLOCK = 512  # a tar block
OPEN_SHARDS = 16  # shard files a loader worker keeps open


# Compressed shards (webdataset streams them) cannot be read here: a sample is read at its offset in the file,
# and a compressed tar has no offsets short of decompressing it from the start. Their JPEG and PNG members are
# compressed already, so decompressing a shard costs about nothing in disk.
COMPRESSED_SHARDS = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def _is_shard_name(name: str) -> bool:
    return name.endswith((".tar",) + COMPRESSED_SHARDS)


def is_shard_split(root: Path, split: str) -> bool:
    """Whether ``split`` names tar shards: a brace pattern or ``.tar`` path, or a folder of ``root`` holding them
    (compressed ones included, which :func:`shard_files` refuses with the fix)."""
    if "{" in split or _is_shard_name(split):
        return True
    try:
        return any(_is_shard_name(name) for name in os.listdir(root / split))
    except OSError:  # not a folder, or one that cannot be listed: the folder reader says which
        return False


def _decompressed_name(name: str) -> Optional[str]:
    """``x.tar`` for a compressed shard ``x.tar.gz`` (or ``x.tgz``, ...); None for any other name."""
    suffix = next((s for s in COMPRESSED_SHARDS if name.endswith(s)), None)
    return None if suffix is None else name[: -len(suffix)] + ".tar"


def _refuse_compressed(files: list[str]) -> None:
    """Refuse the compressed shards among ``files`` that have no decompressed twin (``x.tar.gz`` beside ``x.tar``)."""
    present = set(files)
    compressed = [name for name in files if (twin := _decompressed_name(name)) is not None and twin not in present]
    if compressed:
        raise DataError(f"{len(compressed)} shard(s) are compressed (first: {compressed[0]}); samples are read "
                        f"at their offsets, which a compressed tar does not have: decompress them (e.g. "
                        f"'gunzip -k SHARD.tar.gz', 'xz -dk', 'zstd -d'; the images inside are compressed "
                        f"already) and point the split at the .tar files")


def shard_files(root: Path, split: str) -> list[str]:
    """The tar files of ``split`` (relative to ``root``): its brace pattern expanded, or the folder's, sorted."""
    from webdataset.shardlists import expand_urls

    if "{" in split or _is_shard_name(split):
        try:
            files = [str(root / name) for name in expand_urls(split)]
        except ValueError as exc:  # braceexpand's unbalanced braces
            raise DataError(f"cannot expand the shard pattern {split!r} ({exc}); write it as "
                            f"'train/shard-{{000000..000099}}.tar'") from None
        missing = [name for name in files if not os.path.isfile(name)]
        if missing:
            raise DataError(f"{len(missing)} of the {len(files)} shards of {split!r} do not exist (first: "
                            f"{missing[0]}); fix the pattern (relative to {root}) or add the shards")
        _refuse_compressed(files)
        return files
    try:
        names = os.listdir(root / split)
    except OSError as exc:
        raise DataError(f"cannot list split {split} of {root} ({exc.strerror}); put its .tar shards in {root / split} "
                        f"or name the split with its flag") from None
    folders = [n for n in names if not n.startswith(".") and not _is_shard_name(n) and (root / split / n).is_dir()]
    if folders and any(_is_shard_name(name) for name in names):
        raise DataError(f"{root / split} holds both .tar shards and folders ({', '.join(sorted(folders)[:SKIPPED_SHOWN])}"
                        f"); keep a split's shards and an ImageFolder's class folders apart")
    _refuse_compressed([str(root / split / name) for name in sorted(names)])
    return sorted(str(root / split / name) for name in names if name.endswith(".tar"))


@dataclass
class ShardScan:
    """One shard's usable samples (offsets of their images, labels) and what was left out."""

    offsets: Any = field(default_factory=list)  # lists while scanning, then (n,) int64 arrays
    sizes: Any = field(default_factory=list)
    labels: Any = field(default_factory=list)
    unlabelled: int = 0  # samples without a .cls member, or with one that is not a class index (0..MAX_CLASSES-1)
    imageless: int = 0
    unreadable: int = 0  # images PIL cannot open (only with verify)
    truncated: bool = False  # the file ends inside a member or lacks tar's end blocks
    examples: list[str] = field(default_factory=list)  # "shard:key (why)" of the first samples left out


def tar_members(f: BinaryIO, size: int) -> Generator[tuple[str, int, int], None, bool]:
    """(name, data offset, data size) of each regular file in the tar file ``f`` of ``size`` bytes, from its
    headers (ustar, pax ``path``/``size`` records and GNU long names); returns whether the file is truncated
    or damaged (a bad header checksum, a member running past the end, or no two zero blocks at the end).
    Python's tarfile takes about 7x as long a header (its full TarInfo), which an index of millions of samples
    feels at every start."""
    pos, extended = 0, {}
    while True:
        f.seek(pos)
        header = f.read(BLOCK)
        if header == bytes(BLOCK):
            return f.read(BLOCK) != bytes(BLOCK)
        if len(header) < BLOCK or not _checksum_ok(header):
            return True
        length = (int.from_bytes(header[125:136], "big") if header[124] & 0x80
                  else int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8))
        kind, data = header[156:157], pos + BLOCK
        pos = data + -(-length // BLOCK) * BLOCK
        if data + length > size:
            return True
        if kind in (b"x", b"L"):  # the next member's pax records, or its GNU long name
            body = f.read(length)
            extended = _pax_records(body) if kind == b"x" else {**extended, "path": body.rstrip(b"\0").decode(
                "utf-8", "surrogateescape")}
            continue
        if kind in (b"0", b"\0", b"7"):
            name = header[:100].split(b"\0", 1)[0]
            if header[257:263] == b"ustar\x00" and header[345] != 0:
                name = header[345:500].split(b"\0", 1)[0] + b"/" + name
            name = extended.get("path", name.decode("utf-8", "surrogateescape"))
            length = int(extended.get("size", length))
            if data + length > size:
                return True
            yield name, data, length
        extended = {}


def _checksum_ok(header: bytes) -> bool:
    try:
        stored = int(header[148:156].split(b"\0", 1)[0].strip() or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(header[:148]) + 8 * 32 + sum(header[156:])  # the checksum field counts as spaces


def _pax_records(body: bytes) -> dict[str, str]:
    """A pax header's "<length> <key>=<value>\\n" records."""
    records, pos = {}, 0
    while pos < len(body) and body[pos:pos + 1] != b"\0":
        length = int(body[pos : body.index(b" ", pos)])
        key, _, value = body[body.index(b" ", pos) + 1 : pos + length - 1].partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def _read_label(data: bytes) -> Optional[int]:
    try:
        label = int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return label if 0 <= label < MAX_CLASSES else None


def scan_shard(path: str, verify: bool) -> ShardScan:
    """Read ``path``'s tar headers and labels; with ``verify``, open each image with PIL as the folder scan does."""
    try:
        return _scan_shard(path, os.path.getsize(path), verify)
    except OSError as exc:
        raise DataError(f"cannot read shard {path} ({exc.strerror or exc}); make it readable or remove it") from None


def _scan_shard(path: str, size: int, verify: bool) -> ShardScan:
    from PIL import Image
    from webdataset.tariterators import base_plus_ext

    scan = ShardScan()
    samples: dict[str, dict[str, tuple[int, int]]] = {}  # key -> {extension: (data offset, size)}
    with open(path, "rb") as f:
        headers = tar_members(f, size)
        try:
            while True:
                name, offset, length = next(headers)
                key, ext = base_plus_ext(name)
                if key is not None:
                    samples.setdefault(key, {})[ext.lower()] = (offset, length)
        except StopIteration as stop:
            scan.truncated = stop.value
        if scan.truncated and not samples:
            raise DataError(f"cannot read shard {path} as a tar file (no valid tar header at its start); repack it "
                            f"or remove it")
        for key, members in samples.items():
            image = next((members[ext] for ext in IMAGE_EXTENSIONS if ext in members), None)
            label = None
            if "cls" in members:
                f.seek(members["cls"][0])
                label = _read_label(f.read(members["cls"][1]))
            why = "no image" if image is None else "no label" if label is None else None
            if why is None and verify:
                f.seek(image[0])
                try:
                    with Image.open(io.BytesIO(f.read(image[1]))) as img:
                        img.verify()
                except Exception:  # PIL raises many types, as the folder scan says
                    why = "unreadable image"
            if why is not None:
                scan.imageless += why == "no image"
                scan.unlabelled += why == "no label"
                scan.unreadable += why == "unreadable image"
                if len(scan.examples) < SKIPPED_SHOWN:
                    scan.examples.append(f"{os.path.basename(path)}:{key} ({why})")
                continue
            scan.offsets.append(image[0])
            scan.sizes.append(image[1])
            scan.labels.append(label)
    scan.offsets, scan.sizes, scan.labels = (np.array(v, np.int64) for v in (scan.offsets, scan.sizes, scan.labels))
    return scan


@dataclass(frozen=True)
class ShardIndex:
    """The usable samples of a split's shards: for sample ``i``, its image's shard, byte offset and size, and
    its label; ``scans`` says per shard what was left out."""

    files: tuple[str, ...]
    shard: np.ndarray  # (N,) int32
    offset: np.ndarray  # (N,) int64
    size: np.ndarray  # (N,) int64
    label: np.ndarray  # (N,) int64
    scans: tuple[ShardScan, ...] = field(repr=False, default=())

    def __len__(self) -> int:
        return len(self.label)

    def image_bytes(self, index: int, files: dict[int, Any]) -> bytes:
        """Sample ``index``'s encoded image, read through the open ``files`` (shard number -> file)."""
        shard = int(self.shard[index])
        if shard not in files:
            if len(files) == OPEN_SHARDS:  # a reader moves on through the shards: close the one opened first
                files.pop(next(iter(files))).close()
            files[shard] = open(self.files[shard], "rb")
        f = files[shard]
        f.seek(int(self.offset[index]))
        return f.read(int(self.size[index]))


def scan_shards(files: list[str], verify: bool, desc: str, progress: bool = False) -> ShardIndex:
    """Scan ``files`` in threads (I/O bound) into a :class:`ShardIndex`, kept while the files' sizes and
    modification times stay: the recipe choice and the data set share one scan."""
    try:
        key = (tuple((path, os.stat(path).st_size, os.stat(path).st_mtime_ns) for path in files), verify)
    except OSError as exc:
        raise DataError(f"cannot read shard {exc.filename} ({exc.strerror}); make it readable or remove it") from None
    if key not in _INDEXES:
        _INDEXES.clear()  # one split's index at a time: an index of millions of samples is large
        _INDEXES[key] = _scan_shards(files, verify, desc, progress)
    return _INDEXES[key]


_INDEXES: dict[Any, ShardIndex] = {}


def _scan_shards(files: list[str], verify: bool, desc: str, progress: bool) -> ShardIndex:
    with ThreadPoolExecutor(max_workers=min(16, 2 * (os.cpu_count() or 1))) as pool, progress_lines(
        total=len(files), desc=desc, unit="shard", enabled=progress, delay=1.0
    ) as bar:
        scans = []
        for scan in pool.map(lambda path: scan_shard(path, verify), files):
            scans.append(scan)
            bar.update(1)
    shard = np.concatenate([np.full(len(s.labels), i, np.int32) for i, s in enumerate(scans)])
    column = lambda name: np.concatenate([getattr(s, name) for s in scans])  # noqa: E731
    left_out = tuple(replace(s, offsets=(), sizes=(), labels=()) for s in scans)  # the counts, not the samples
    return ShardIndex(tuple(files), shard, column("offsets"), column("sizes"), column("labels"), left_out)


def rank_part(n: int, rank: int, world_size: int, equal: bool) -> tuple[int, int]:
    """(start, length) of ``rank``'s contiguous part of ``n`` samples: ``equal`` parts of ``n // world_size``
    (training: every rank takes as many steps), else parts that differ by at most one and cover all."""
    if equal:
        length = n // world_size
        return rank * length, length
    base, extra = divmod(n, world_size)
    return rank * base + min(rank, extra), base + (rank < extra)


class ShardStream(IterableDataset):
    """(image, label) of a :class:`ShardIndex`, ``transform`` applied (its randomness fixed by (seed, epoch,
    sample) when ``seed`` is set); ``shuffle``: a new order each epoch. :meth:`distribute` gives it its rank
    and batch size, :meth:`set_epoch` the epoch and the samples of it already trained."""

    def __init__(self, index: ShardIndex, transform: Optional[Callable] = None, seed: Optional[int] = None,
                 shuffle: bool = False, loader: Callable[[Any], Any] = rgb_loader, order_seed: int = 0):
        self.index, self.transform, self.seed, self.shuffle, self.loader = index, transform, seed, shuffle, loader
        self.order_seed = order_seed
        self.rank, self.world_size, self.batch_size, self.equal = 0, 1, 1, False
        self.epoch = self.start = 0

    def __len__(self) -> int:
        """Samples this rank serves in the epoch from its start (all of them before :meth:`distribute`)."""
        served = self.shard_size // self.batch_size * self.batch_size if self.equal else self.shard_size
        return served - self.start

    def transformed(self, transform: Callable, seed: Optional[int] = None) -> ShardStream:
        """This stream with ``transform``; a ``seed`` also shuffles it each epoch (training)."""
        return ShardStream(self.index, transform, seed, shuffle=seed is not None, loader=self.loader,
                           order_seed=seed or 0)

    def distribute(self, rank: int, world_size: int, equal: bool, batch_size: int = 1) -> None:
        """Serve ``rank``'s part of each epoch in batches of ``batch_size``; ``equal``: as many samples on
        every rank, in whole batches (training)."""
        self.rank, self.world_size, self.equal, self.batch_size = rank, world_size, equal, batch_size

    @property
    def shard_size(self) -> int:
        """Samples this rank gets in a whole epoch (before training's cut to whole batches)."""
        return rank_part(len(self.index), self.rank, self.world_size, self.equal)[1]

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Serve epoch ``epoch`` from its ``start``-th sample on this rank (a multiple of the batch size)."""
        if not 0 <= start <= self.shard_size:
            raise ValueError(f"start must be in [0, {self.shard_size}], got {start}")
        self.epoch, self.start = epoch, start

    def epoch_order(self) -> np.ndarray:
        """This rank's sample indices for the epoch, in the order they are served (before ``start``)."""
        counts = np.bincount(self.index.shard, minlength=len(self.index.files))
        shard_starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        shards = list(range(len(counts)))
        if self.shuffle:
            random.Random(f"{self.order_seed}-{self.epoch}").shuffle(shards)
        sequence = np.concatenate([np.arange(shard_starts[s], shard_starts[s] + counts[s]) for s in shards]
                                  or [np.zeros(0, np.int64)])
        begin, length = rank_part(len(sequence), self.rank, self.world_size, self.equal)
        part = sequence[begin : begin + length]
        if self.shuffle:
            rng = np.random.default_rng([self.order_seed, self.epoch, self.rank])
            for w in range(0, len(part), SHUFFLE_WINDOW):
                part[w : w + SHUFFLE_WINDOW] = rng.permutation(part[w : w + SHUFFLE_WINDOW])
        if self.equal:  # whole batches only, as the loop's drop_last
            part = part[: len(part) // self.batch_size * self.batch_size]
        return part

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        worker = get_worker_info()
        worker_id, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        order = self.epoch_order()[self.start :]
        batches = range(worker_id * self.batch_size, len(order), workers * self.batch_size)
        files: dict[int, Any] = {}
        try:
            for first in batches:
                batch = order[first : first + self.batch_size]
                reads = sorted(batch, key=lambda i: (self.index.shard[i], self.index.offset[i]))  # sequential reads
                encoded = {int(i): self.index.image_bytes(int(i), files) for i in reads}
                for i in batch:
                    yield self._sample(int(i), encoded[int(i)])
        finally:
            for f in files.values():
                f.close()

    def _sample(self, index: int, encoded: bytes) -> tuple[Any, int]:
        try:
            img = self.loader(io.BytesIO(encoded))
        except DECODE_ERRORS as exc:
            path = self.index.files[int(self.index.shard[index])]
            raise DataError(f"cannot read the image at byte {int(self.index.offset[index])} of shard {path} "
                            f"({type(exc).__name__}: {exc}); repack the shard, or turn image verification back on "
                            f"(verify_images=true) to leave unreadable images out") from exc
        label = int(self.index.label[index])
        if self.transform is None:
            return img, label
        if self.seed is None:
            return self.transform(img), label
        with seeded_rng(sample_seed(self.seed, self.epoch, index)):
            return self.transform(img), label


def _left_out(scans: list[tuple[str, ShardScan]]) -> tuple[int, str]:
    """How many samples the scans left out, and the warning's detail."""
    count = sum(s.unlabelled + s.imageless + s.unreadable for _, s in scans)
    kinds = [(sum(getattr(s, name) for _, s in scans), what) for name, what in
             (("unlabelled", "without a label"), ("imageless", "without an image"), ("unreadable", "unreadable"))]
    parts = [f"{n} {what}" for n, what in kinds if n]
    truncated = [os.path.basename(path) for path, s in scans if s.truncated]
    if truncated:
        parts.append(f"{len(truncated)} truncated shard(s) read up to the break: {', '.join(truncated[:SKIPPED_SHOWN])}")
    examples = [e for _, s in scans for e in s.examples][:SKIPPED_SHOWN]
    return count, "; ".join(parts) + (f"; first: {', '.join(examples)}" if examples else "")


def open_shards(root: Path, splits: dict[str, str], verify: bool = True, warn: bool = True,
                in_chans: int = 3) -> tuple[tuple[str, ...], dict[str, ShardStream]]:
    """The class names (:func:`shard_class_names`) and ``{role: stream}`` of the shard splits named ``splits``
    (role -> split)."""
    from .folder import gray_loader

    loader = gray_loader if in_chans == 1 else rgb_loader
    indices, problems = {}, []
    for role, split in splits.items():
        files = shard_files(root, split)
        if not files:
            raise DataError(f"{root / split} holds no .tar shards; put the split's shards in it")
        index = scan_shards(files, verify, f"reading {split} shards", progress=warn)
        if not len(index):
            raise DataError(f"the shards of {split} in {root} hold no usable samples (each needs a .jpg or .png and "
                            f"a .cls class index); repack them")
        indices[role] = index
        problems.extend(zip(files, index.scans))
    count, detail = _left_out(problems)
    if (count or detail) and warn:
        warnings.warn(f"left {count} sample(s) of the shards in {root} out: {detail}; repack the shards to use them",
                      SkippedImagesWarning, stacklevel=3)
    num_classes = max(int(index.label.max()) for index in indices.values()) + 1
    classes = shard_class_names(root, num_classes)
    return classes, {role: ShardStream(index, loader=loader) for role, index in indices.items()}


def shard_class_names(root: Path, num_classes: int) -> tuple[str, ...]:
    """The names of the ``num_classes`` classes the shards use: ``root/_info.json``'s ``classes`` (what
    ``weightformer data pack`` writes, in timm's info file), else ``root/classes.txt`` (line ``i`` names class
    ``i``), else the class indices."""
    import json

    info, names_file = root / "_info.json", root / "classes.txt"
    source = info if info.is_file() else names_file
    if not source.is_file():
        return tuple(str(i) for i in range(num_classes))
    try:
        classes = (tuple(str(name) for name in json.loads(info.read_text())["classes"]) if source == info else
                   tuple(line.strip() for line in names_file.read_text().splitlines() if line.strip()))
    except (ValueError, KeyError, TypeError) as exc:  # (a file not in UTF-8 too)
        raise DataError(f"{source} names no classes ({type(exc).__name__}: {exc}); write it with `weightformer "
                        f"data pack` (UTF-8, one name a line in classes.txt) or remove it") from None
    if len(classes) < num_classes:
        raise DataError(f"{source} names {len(classes)} classes and the shards use class index {num_classes - 1}; "
                        f"give every class index a name")
    return classes


def split_summary(root: Path, split: str, verify: bool, limit: int) -> tuple[int, int, list[tuple[int, int]]]:
    """(usable samples, shards, (width, height) of the first ``limit`` readable images) of ``split``, for the
    recipe choice: from the same cached scan that the data set then opens (tar headers and labels, with
    ``verify`` its images too)."""
    from PIL import Image

    files = shard_files(root, split)
    shown = os.environ.get("RANK", "0") == "0"  # the recipe is chosen in every process: one shows progress
    index = scan_shards(files, verify, desc=f"reading {split} shards", progress=shown)
    sizes: list[tuple[int, int]] = []
    opened: dict[int, Any] = {}
    try:
        for i in range(len(index)):
            try:
                with Image.open(io.BytesIO(index.image_bytes(i, opened))) as img:
                    sizes.append(img.size)
            except DECODE_ERRORS:
                continue
            if len(sizes) == limit:
                break
    finally:
        for f in opened.values():
            f.close()
    return len(index), len(files), sizes

