"""EMNIST from its IDX files (``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte``)."""

from __future__ import annotations

import numpy as np

from rayfl.data.datasets import Arrays, present, require
from rayfl.data.datasets.fmnist import find, read_pair

CLASSES = {"letters": 26, "digits": 10, "balanced": 47, "byclass": 62, "bymerge": 47, "mnist": 10}
HINT = ("unzip the 'gzip.zip' of https://www.nist.gov/itl/products-and-services/emnist-dataset "
        "and set data.root to the folder holding the files")


def _stems(split: str) -> dict[str, str]:
    return {f"{k}_{part}": f"emnist-{split}-{part}-{kind}-ubyte" for part in ("train", "test")
            for k, kind in (("x", "images-idx3"), ("y", "labels-idx1"))}


def sources(cfg) -> list[str]:
    """The split's four IDX files that :func:`load` reads (those present)."""
    return present(cfg.root, list(_stems(cfg.emnist_split).values()), "gzip")


def load(cfg, seed: int) -> Arrays:
    """uint8 rows of 784 pixels, upright (EMNIST stores images transposed); letters as 0..25."""
    stems = _stems(cfg.emnist_split)
    root = require(cfg.root, list(stems.values()), f"EMNIST-{cfg.emnist_split}'s IDX files "
                   "(plain or .gz)", HINT, "gzip")
    f = {k: find(root, s) for k, s in stems.items()}
    classes = CLASSES[cfg.emnist_split]
    first = 1 if cfg.emnist_split == "letters" else 0  # letters are labelled 1..26

    def split(part):
        x, y = read_pair(f[f"x_{part}"], f[f"y_{part}"], classes, first)
        upright = np.ascontiguousarray(x.reshape(-1, 28, 28).transpose(0, 2, 1))
        return upright.reshape(len(x), -1), y

    (x_train, y_train), (x_test, y_test) = split("train"), split("test")
    return Arrays(x_train, y_train, x_test, y_test, input_shape=(1, 28, 28), num_classes=classes,
                  scale=1 / 255)
