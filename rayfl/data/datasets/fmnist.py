"""Fashion-MNIST from its IDX files (the Debian package ``dataset-fashion-mnist`` by default)."""

from __future__ import annotations

import gzip
import os

import numpy as np

from rayfl.data.datasets import Arrays
from rayfl.schema import ConfigError

DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"
FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
INSTALL_HINT = ("install it with `sudo apt-get install dataset-fashion-mnist` (files land in "
                f"{DEFAULT_ROOT}), or set data.root to a directory holding the four IDX files")


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (optionally gzipped): big-endian dims after a 4-byte magic."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(int)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(root: str, stem: str) -> str | None:
    """The IDX file ``stem`` in ``root``, plain or gzipped."""
    for name in (stem + ".gz", stem):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    return None


def check_files(root: str | None) -> str:
    """The dataset directory, or a ConfigError naming what is missing and how to install it."""
    root = os.path.expanduser(root or DEFAULT_ROOT)
    missing = [stem for stem in FILES.values() if find(root, stem) is None]
    if missing:
        raise ConfigError("data.root", root, f"a directory with Fashion-MNIST's "
                          f"{', '.join(m + '[.gz]' for m in missing)}; {INSTALL_HINT}")
    return root


def load(cfg, seed: int) -> Arrays:
    """Fashion-MNIST as uint8 rows of 784 pixels (scaled to [0, 1] for the model)."""
    root = check_files(cfg.root)
    a = {k: read_idx(find(root, stem)) for k, stem in FILES.items()}
    return Arrays(a["x_train"].reshape(len(a["x_train"]), -1), a["y_train"].astype(np.int64),
                  a["x_test"].reshape(len(a["x_test"]), -1), a["y_test"].astype(np.int64),
                  input_shape=(1, 28, 28), num_classes=10, scale=1 / 255)
