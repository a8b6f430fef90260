"""Classification on webdataset tar shards and Hugging Face data sets: opening, sharding over ranks and loader
workers (every sample once per epoch), exact resume, recipe choice, eval and predict, and bad shards."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from conftest_train import assert_same_weights, tiny_config, weights
from weightformer.classification.evaluate import evaluate_checkpoint
from weightformer.classification.predict import predict
from weightformer.classification.recipes import choose_recipe
from weightformer.data import DataError, SkippedImagesWarning, open_dataset
from weightformer.data.hf import HFImageDataset
from weightformer.data.sampler import split_loader, split_sampler
from weightformer.data.shards import tar_members
from weightformer.engine import train
from weightformer.engine.weights import load_model

CLASSES = ("cat", "dog", "owl")


def encoded(index: int, label: int, size: int = 20, fmt: str = "PNG") -> bytes:
    """A distinct image (its pixels fixed by ``index``) whose mean colour says its class."""
    rng = np.random.default_rng(index)
    pixels = np.clip(rng.normal(50 + 75 * label, 30, (size, size, 3)), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def write_shards(folder: Path, counts: list[int], first: int = 0) -> list[int]:
    """Shards in ``folder`` holding ``counts`` samples each, written by webdataset's ShardWriter as timm's
    are (``__key__``, ``png``, ``cls``); returns the labels in order."""
    folder.mkdir(parents=True, exist_ok=True)
    labels, index = [], first
    for shard, count in enumerate(counts):
        with wds.TarWriter(str(folder / f"shard-{shard:06d}.tar")) as sink:
            for _ in range(count):
                label = index % len(CLASSES)
                sink.write({"__key__": f"s{index:06d}", "png": encoded(index, label), "cls": label})
                labels.append(label)
                index += 1
    return labels


def make_shard_tree(root: Path, train: list[int], val: list[int]) -> Path:
    write_shards(root / "train", train)
    write_shards(root / "val", val, first=10_000)
    (root / "classes.txt").write_text("\n".join(CLASSES) + "\n")
    return root


def digest_loader(source: io.BytesIO) -> str:
    """A loader that names a sample by its encoded bytes, to count which samples a stream serves."""
    return hashlib.sha1(source.read()).hexdigest()


def served(stream, rank: int, world_size: int, train: bool, batch_size: int, workers: int, epoch: int = 0,
           start: int = 0) -> list[str]:
    sampler = split_sampler(stream, rank, world_size, train=train, seed=3)
    sampler.set_epoch(epoch, start)
    loader = split_loader(stream, sampler, batch_size, drop_last=train, num_workers=workers,
                          collate_fn=lambda batch: [name for name, _ in batch])
    return [name for batch in loader for name in batch]


def test_shard_tree_opens_with_class_names_and_counts(tmp_path: Path):
    root = make_shard_tree(tmp_path / "shards", [7, 6, 5], [4, 3])
    info, splits = open_dataset(str(root))
    assert info.classes == CLASSES and info.num_classes == 3 and info.name == str(root.resolve())
    assert len(splits["train"]) == 18 and len(splits["val"]) == 7
    choice = choose_recipe(str(root), {})
    assert choice.recipe.values["img_size"] == 20 and choice.recipe.path.name == "small-images.yaml"
    assert f"{root / 'train'} (3 shards) holds 18 images of 20 px" in choice.line()
    # A brace pattern through the split flags: two of the three training shards.
    info, splits = open_dataset(str(root), split_names={"train": "train/shard-{000000..000001}.tar"})
    assert len(splits["train"]) == 13


def test_stream_order_does_not_depend_on_the_loader_workers(tmp_path: Path):
    root = make_shard_tree(tmp_path / "shards", [9, 8, 7, 6], [5])
    _, splits = open_dataset(str(root), verify=False)
    stream = splits["train"].transformed(lambda x: x, seed=3)
    stream.loader = digest_loader
    one = served(stream, rank=1, world_size=2, train=True, batch_size=3, workers=0, epoch=2)
    two = served(stream, rank=1, world_size=2, train=True, batch_size=3, workers=2, epoch=2)
    assert one == two and len(one) == len(stream) == 15  # 30 // 2 ranks, in whole batches of 3
    assert served(stream, 1, 2, True, 3, workers=2, epoch=2, start=6) == one[6:]  # a resumed epoch: the rest
    assert one != served(stream, 1, 2, True, 3, workers=0, epoch=3)  # each epoch its own order


COUNT_SCRIPT = """
import json, os, sys
from weightformer.data import open_dataset
from weightformer.engine.distributed import init_distributed, shutdown_distributed
from test_streaming_data import digest_loader, served

info = init_distributed("cpu")
_, splits = open_dataset(sys.argv[1], verify=False, warn=False)
train = splits["train"].transformed(lambda x: x, seed=3)
train.loader = splits["val"].loader = digest_loader
seen = {"train": [served(train, info.rank, info.world_size, True, 2, workers=2, epoch=e) for e in (0, 1)],
        "val": served(splits["val"], info.rank, info.world_size, False, 2, workers=2)}
with open(os.path.join(sys.argv[2], f"rank{info.rank}.json"), "w") as f:
    json.dump(seen, f)
shutdown_distributed(info)
"""


def test_two_ranks_by_two_workers_see_every_sample_once_per_epoch(tmp_path: Path):
    """3 shards for 4 readers (fewer shards than ranks x workers): the samples, not the shards, are split."""
    root = make_shard_tree(tmp_path / "shards", [11, 7, 5], [6, 5, 2])
    script = tmp_path / "count.py"
    script.write_text(textwrap.dedent(COUNT_SCRIPT))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                                            os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(root), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    _, splits = open_dataset(str(root), verify=False)
    everything = [digest_loader(io.BytesIO(splits["train"].index.image_bytes(i, {}))) for i in range(23)]
    for epoch in (0, 1):
        per_rank = [rank["train"][epoch] for rank in ranks]
        assert [len(p) for p in per_rank] == [10, 10]  # 23 // 2 = 11 a rank, cut to whole batches of 2
        union = per_rank[0] + per_rank[1]
        assert len(set(union)) == 20 and set(union) <= set(everything)  # none twice
    assert ranks[0]["train"][0] != ranks[0]["train"][1]
    val = ranks[0]["val"] + ranks[1]["val"]
    assert len(val) == 13 and len(set(val)) == 13  # validation: every sample exactly once


def test_streamed_run_resumes_exactly_with_other_workers(tmp_path: Path):
    root = make_shard_tree(tmp_path / "shards", [10, 9, 7], [4, 3])
    whole = train(tiny_config(root, tmp_path / "whole", epochs=2), task="classification")
    assert whole.global_step == 12  # 26 samples, batch 4: 6 steps an epoch
    config = tiny_config(root, tmp_path / "parts", epochs=2, max_steps=8)
    train(config, task="classification")
    resumed = train({**config, "max_steps": None, "resume": "auto", "workers": 2}, task="classification")
    assert resumed.global_step == 12
    assert_same_weights(weights(tmp_path / "whole" / "last.pt"), weights(tmp_path / "parts" / "last.pt"))

    result = evaluate_checkpoint(whole.best_checkpoint, workers=0, device="cpu")
    assert result["num_samples"] == 7 and result["data"] == str(root.resolve())
    loaded = load_model(whole.best_checkpoint, task="classification")
    image = tmp_path / "one.png"
    image.write_bytes(encoded(1, 1))
    assert predict(loaded, image, top_k=3).rows[0][1][0][1] in CLASSES


def save_hf(root: Path, val_name: str = "validation", columns: tuple[str, str] = ("image", "label")) -> Path:
    features = datasets.Features({columns[0]: datasets.Image(), columns[1]: datasets.ClassLabel(names=list(CLASSES))})
    splits = {}
    for name, count, first in (("train", 18, 0), (val_name, 6, 10_000)):
        rows = [{"bytes": encoded(first + i, (first + i) % 3), "path": None} for i in range(count)]
        splits[name] = datasets.Dataset.from_dict({columns[0]: rows, columns[1]: [(first + i) % 3 for i in range(count)]},
                                                  features=features)
    datasets.DatasetDict(splits).save_to_disk(str(root))
    return root


def test_hugging_face_data_set_trains_resumes_and_evaluates(tmp_path: Path):
    root = save_hf(tmp_path / "hf")
    info, splits = open_dataset(str(root))
    assert info.classes == CLASSES and len(splits["train"]) == 18 and len(splits["val"]) == 6
    assert choose_recipe(str(root), {}).reason.startswith(f"the train split of {root} holds 18 images of 20 px")
    whole = train(tiny_config(root, tmp_path / "whole", epochs=2), task="classification")
    config = tiny_config(root, tmp_path / "parts", epochs=2, max_steps=5)
    train(config, task="classification")
    train({**config, "max_steps": None, "resume": "auto"}, task="classification")
    assert_same_weights(weights(tmp_path / "whole" / "last.pt"), weights(tmp_path / "parts" / "last.pt"))
    assert evaluate_checkpoint(whole.best_checkpoint, workers=0, device="cpu")["num_samples"] == 6


def test_hugging_face_columns_and_splits_by_flag_and_parquet_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))  # where parquet is converted
    root = save_hf(tmp_path / "hf", val_name="holdout", columns=("picture", "kind"))
    with pytest.raises(DataError, match="has no val split .*--val-split"):
        open_dataset(str(root), columns=("picture", "kind"))
    with pytest.raises(DataError, match="no image column .*--image-column"):
        open_dataset(str(root), split_names={"val": "holdout"})
    info, splits = open_dataset(str(root), split_names={"val": "holdout"}, columns=("picture", "kind"))
    assert len(splits["val"]) == 6 and splits["val"][0][1] == 1
    choice = choose_recipe(str(root), {"image_column": "picture", "label_column": "kind"})  # the run's first line
    assert choice.reason.startswith(f"the train split of {root} holds 18 images")
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for name, data in datasets.load_from_disk(str(root)).items():
        data.to_parquet(str(parquet / f"{'validation' if name == 'holdout' else name}-00000-of-00001.parquet"))
    monkeypatch.chdir(tmp_path)  # --data parquet, a relative folder, not datasets' builder of that name
    info, splits = open_dataset("parquet", columns=("picture", "kind"))
    assert info.num_classes == 3 and len(splits["train"]) == 18 and len(splits["val"]) == 6
    assert (tmp_path / "cache" / "parquet").is_dir()


def test_an_image_folder_with_a_parquet_file_beside_it_is_read_as_an_image_folder(tmp_path: Path):
    root = tmp_path / "folder"
    for split, count in (("train", 4), ("val", 2)):
        for label in ("cat", "dog"):
            (root / split / label).mkdir(parents=True)
            for i in range(count):
                (root / split / label / f"{i}.png").write_bytes(encoded(i, 0))
    features = datasets.Dataset.from_dict({"path": ["train/cat/0.png"], "embedding": [[0.5, 0.25]]})
    features.to_parquet(str(root / "features.parquet"))  # e.g. a table of embeddings exported beside the images
    info, splits = open_dataset(str(root))
    assert info.classes == ("cat", "dog") and len(splits["train"]) == 8 and len(splits["val"]) == 4
    assert not any(isinstance(split, HFImageDataset) for split in splits.values())


def test_bad_shards_are_one_warning_line_with_counts(tmp_path: Path):
    root = make_shard_tree(tmp_path / "shards", [6, 6], [4])
    with wds.TarWriter(str(root / "train" / "shard-000002.tar")) as sink:
        sink.write({"__key__": "nolabel", "png": encoded(1, 0)})
        sink.write({"__key__": "corrupt", "png": encoded(2, 0)[:40], "cls": 0})
        sink.write({"__key__": "good", "png": encoded(3, 0), "cls": 0})
    whole = (root / "train" / "shard-000001.tar").read_bytes()
    (root / "train" / "shard-000001.tar").write_bytes(whole[: len(whole) // 2])  # truncated mid-way
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info, splits = open_dataset(str(root))
    lines = [str(w.message) for w in caught if issubclass(w.category, SkippedImagesWarning)]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "1 without a label" in lines[0] and "1 unreadable" in lines[0]
    assert "1 truncated shard(s) read up to the break: shard-000001.tar" in lines[0]
    kept_from_truncated = int((splits["train"].index.shard == 1).sum())
    assert 0 < kept_from_truncated < 6 and len(splits["train"]) == 6 + kept_from_truncated + 1
    # Without verification the corrupt image is found when it is read: one line naming the shard.
    _, splits = open_dataset(str(root), verify=False, warn=False)
    stream = splits["train"]
    stream.distribute(0, 1, equal=False, batch_size=1)
    with pytest.raises(DataError, match=r"cannot read the image at byte \d+ of shard .*shard-000002.tar"):
        list(stream)
    with tarfile.open(root / "val" / "junk.tar", "w"):
        pass
    (root / "val" / "junk.tar").write_bytes(b"not a tar file" * 100)
    with pytest.raises(DataError, match="cannot read shard .*junk.tar as a tar file"):
        open_dataset(str(root))


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT])
def test_tar_headers_are_read_as_tarfile_reads_them(tmp_path: Path, fmt: int):
    """Long names (GNU records, ustar's prefix, pax paths), non-ASCII names and empty members."""
    names = ["a/" * 60 + "x.cls", "short.png", "d/" * 40 + "y.jpg", "ünï.cls", "empty.json"]
    if fmt == tarfile.USTAR_FORMAT:
        names = [n for n in names if n.isascii()]
    path = tmp_path / "any.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        for i, name in enumerate(names):
            body = b"7" * (0 if name == "empty.json" else 100 * i + 1)
            member = tarfile.TarInfo(name)
            member.size = len(body)
            tar.addfile(member, io.BytesIO(body))
    with tarfile.open(path) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]
    with open(path, "rb") as f:
        members = tar_members(f, path.stat().st_size)
        found = []
        with pytest.raises(StopIteration) as end:
            while True:
                found.append(next(members))
    assert found == expected and end.value.value is False


def test_hugging_face_rows_without_label_or_readable_image_are_one_warning_line(tmp_path: Path):
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    rows = [{"bytes": encoded(i, i % 2), "path": None} for i in range(6)]
    rows[4] = {"bytes": encoded(4, 0)[:30], "path": None}  # cut short
    data = datasets.Dataset.from_dict({"image": rows, "label": [0, 1, None, 1, 0, -1]}, features=features)
    datasets.DatasetDict({"train": data, "val": data}).save_to_disk(str(tmp_path / "hf"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info, splits = open_dataset(str(tmp_path / "hf"))
    lines = [str(w.message) for w in caught if issubclass(w.category, SkippedImagesWarning)]
    assert len(lines) == 1 and lines[0].startswith("left 6 row(s) of ") and "train:2 (no label)" in lines[0]
    assert len(splits["train"]) == 3 and info.classes == ("0", "1")
    _, splits = open_dataset(str(tmp_path / "hf"), verify=False, warn=False)
    with pytest.raises(DataError, match="cannot read the image of row 4 of the train split"):
        [splits["train"][i] for i in range(len(splits["train"]))]


def test_odd_shards_and_labels_are_one_line(tmp_path: Path):
    """Labels that are no class index (negative, beyond int64, not text, absurdly large) are left out; a split
    folder that is missing, or mixes shards with class folders, and a classes.txt not in UTF-8 are one error."""
    root = make_shard_tree(tmp_path / "shards", [6], [3])
    with wds.TarWriter(str(root / "train" / "odd.tar")) as sink:
        for key, text in (("neg", b"-3"), ("wide", b"9" * 30), ("binary", b"\xff\xfe"), ("huge", b"1000000000")):
            sink.write({"__key__": key, "png": encoded(1, 0), "cls": text})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info, splits = open_dataset(str(root))
    assert info.num_classes == 3 and len(splits["train"]) == 6
    assert "4 without a label" in str(caught[-1].message)
    (root / "classes.txt").write_bytes(b"\xffcat\n")
    with pytest.raises(DataError, match="classes.txt names no classes"):
        open_dataset(str(root), warn=False)
    (root / "classes.txt").unlink()
    with pytest.raises(DataError, match="cannot list split test of"):
        open_dataset(str(root), split_names={"val": "test"}, warn=False)
    with pytest.raises(DataError, match="cannot expand the shard pattern 'train/shard-{0..1'"):
        open_dataset(str(root), split_names={"train": "train/shard-{0..1"}, warn=False)
    (root / "train" / "cat").mkdir()
    with pytest.raises(DataError, match="holds both .tar shards and folders"):
        open_dataset(str(root), warn=False)


def test_compressed_shards_are_one_error_until_decompressed(tmp_path: Path):
    """webdataset streams .tar.gz shards; this reader reads samples at their offsets, so a compressed shard is
    one error naming the fix (as a folder's member and as a pattern), and once decompressed beside it
    (``gunzip -k``), the .tar is read and the .tar.gz ignored."""
    import gzip
    import shutil

    root = make_shard_tree(tmp_path / "shards", [6, 4], [3])
    shard = root / "train" / "shard-000001.tar"
    with open(shard, "rb") as raw, gzip.open(f"{shard}.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    shard.unlink()
    with pytest.raises(DataError, match=r"1 shard\(s\) are compressed \(first: .*shard-000001.tar.gz\).*gunzip -k"):
        open_dataset(str(root), warn=False)
    with pytest.raises(DataError, match="are compressed"):
        open_dataset(str(root), split_names={"train": "train/shard-{000001..000001}.tar.gz"}, warn=False)
    with gzip.open(f"{shard}.gz", "rb") as packed, open(shard, "wb") as raw:
        shutil.copyfileobj(packed, raw)
    info, splits = open_dataset(str(root), warn=False)
    assert len(splits["train"]) == 10


@pytest.mark.parametrize("labels", [["a", "b"], [0.5, 1.0]])
def test_hugging_face_labels_that_are_not_class_indices_are_one_error(tmp_path: Path, labels: list):
    data = datasets.Dataset.from_dict({"image": [{"bytes": encoded(i, 0), "path": None} for i in range(2)],
                                       "label": labels, "size": [1, 2]}).cast_column("image", datasets.Image())
    datasets.DatasetDict({"train": data, "val": data}).save_to_disk(str(tmp_path / "hf"))
    with pytest.raises(DataError, match="label column of the train split .* not class indices; .*--label-column"):
        open_dataset(str(tmp_path / "hf"))
    with pytest.raises(DataError, match="size column of the train split .* not images; .*--image-column"):
        open_dataset(str(tmp_path / "hf"), columns=("size", "size"))
    (tmp_path / "hf" / "dataset_dict.json").write_text("{")  # damaged
    with pytest.raises(DataError, match="cannot open the saved data set in .*save it again"):
        open_dataset(str(tmp_path / "hf"))
