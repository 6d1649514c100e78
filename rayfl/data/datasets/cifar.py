"""CIFAR-10/100 from the python-pickle batches that torchvision reads (cifar-*-python)."""

from __future__ import annotations

import os

import numpy as np

from rayfl import safe_pickle
from rayfl.data.datasets import READ_ERRORS, Arrays, present, require
from rayfl.schema import ConfigError

LAYOUT = {  # dataset -> (folder, train files, test file, label key, classes)
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], "test_batch",
                b"labels", 10),
    "cifar100": ("cifar-100-python", ["train"], "test", b"fine_labels", 100),
}
HINT = ("download and unpack the python version from https://www.cs.toronto.edu/~kriz/cifar.html "
        "(or torchvision's download=True) and set data.root to the folder holding it")


def _batch(path: str, label_key: bytes, classes: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            d = safe_pickle.load(f, encoding="bytes")
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3072)
        y = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
        if len(x) != len(y) or not len(y):
            raise ValueError(f"{len(x)} images but {len(y)} labels")
        if not (0 <= y.min() and y.max() < classes):
            raise ValueError(f"labels {y.min()}..{y.max()}")
    except READ_ERRORS as e:
        raise ConfigError("data.root", path, f"a CIFAR python batch: a pickled dict with b'data' "
                          f"(n ≥ 1 × 3072 uint8) and {label_key!r} (n labels in "
                          f"0..{classes - 1}) ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]})") from None
    return x, y


def sources(cfg) -> list[str]:
    """The batch files that :func:`load` reads (those present)."""
    folder, train, test, _, _ = LAYOUT[cfg.dataset]
    return present(cfg.root, train + [test], folder)


def load(cfg, seed: int) -> Arrays:
    """uint8 rows of 3072 values (channel-major RGB, 32×32), fine labels for CIFAR-100."""
    folder, train, test, key, classes = LAYOUT[cfg.dataset]
    root = require(cfg.root, train + [test], f"{cfg.dataset}'s {folder}/ batches", HINT, folder)
    parts = [_batch(os.path.join(root, name), key, classes) for name in train]
    x_te, y_te = _batch(os.path.join(root, test), key, classes)
    return Arrays(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                  x_te, y_te, input_shape=(3, 32, 32), num_classes=classes, scale=1 / 255)
