"""CelebA in LEAF's preprocessed json (``train/*.json``, ``test/*.json``): x image file names,
y smiling or not, one client per celebrity; images read from the user's CelebA folder.

Images are looked up in ``data.root``'s ``raw/img_align_celeba`` (LEAF's layout) or
``img_align_celeba``, resized to 84×84 and converted to RGB as LEAF's model reads them, and
stored as uint8 channel-major rows (scaled to [0, 1] for the model).
"""

from __future__ import annotations

import os

import numpy as np

from rayfl.data.datasets import Arrays
from rayfl.data.datasets.leaf import json_files, labels, read_users
from rayfl.deferred import deferred
from rayfl.schema import ConfigError

Image = deferred("PIL.Image")

natural = True  # every training row carries its celebrity (partition: natural)

SIDE = 84  # LEAF models/celeba: IMAGE_SIZE
HINT = ("run LEAF's data/celeba/preprocess.sh (https://github.com/TalwalkarLab/leaf) and set "
        "data.root to its data/celeba/data folder, with the images in raw/img_align_celeba")


def image_dir(root: str) -> str:
    """The folder holding the aligned images."""
    found = _image_dir(root)
    if found is None:
        raise ConfigError("data.root", root, f"a folder with raw/img_align_celeba (the CelebA "
                                             f"images the json names); {HINT}")
    return found


def _image_dir(root: str | None) -> str | None:
    for sub in (os.path.join("raw", "img_align_celeba"), "img_align_celeba"):
        path = os.path.join(os.path.expanduser(root or ""), sub)
        if root and os.path.isdir(path):
            return path
    return None


def _images(folder: str, names: list[str]) -> np.ndarray:
    out = np.empty((len(names), 3 * SIDE * SIDE), dtype=np.uint8)
    for i, name in enumerate(names):
        path = os.path.join(folder, name)
        try:
            with Image.open(path) as img:
                rgb = np.asarray(img.resize((SIDE, SIDE)).convert("RGB"), dtype=np.uint8)
        except (OSError, Image.UnidentifiedImageError, ValueError) as e:
            raise ConfigError("data.root", path, f"an image file the LEAF json names "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") \
                from None
        out[i] = rgb.transpose(2, 0, 1).reshape(-1)
    return out


def _rows(x: list, y: list) -> dict:
    """One celebrity's rows: x image file names, y labels 0 or 1."""
    for i, name in enumerate(x):
        if not isinstance(name, str) or not name:
            raise ValueError(f"x rows that are image file names (x[{i}] is {name!r})")
    return {"x": x, "y": labels(y, 2)}


def sources(cfg) -> list[str]:
    """The json files and the image folder that :func:`load` reads."""
    folder = _image_dir(cfg.root)
    return json_files(cfg.root) + ([folder] if folder else [])


def load(cfg, seed: int) -> Arrays:
    """84×84 RGB images as uint8 rows, labels 0/1; celebrities sorted by id become groups."""
    train = read_users(cfg.root, "train", "celeba", HINT, _rows)
    test = read_users(cfg.root, "test", "celeba", HINT, _rows)
    folder = image_dir(cfg.root)
    users, test_users = sorted(train), sorted(test)
    x = _images(folder, [n for u in users for n in train[u]["x"]])
    xt = _images(folder, [n for u in test_users for n in test[u]["x"]])
    y = np.concatenate([train[u]["y"] for u in users])
    yt = np.concatenate([test[u]["y"] for u in test_users])
    return Arrays(x, y, xt, yt, input_shape=(3, SIDE, SIDE), num_classes=2, scale=1 / 255,
                  groups=np.repeat(np.arange(len(users)), [len(train[u]["y"]) for u in users]))
