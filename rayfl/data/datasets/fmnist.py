"""Fashion-MNIST from its IDX files: those of the Debian package ``dataset-fashion-mnist``, else
those ``rayfl data fetch fmnist`` fetched, unless data.root names others."""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from rayfl.data.datasets import Arrays
from rayfl.data.fetch_sources import SOURCES, default_folder
from rayfl.schema import ConfigError

DEFAULT_ROOT = SOURCES["fmnist"].system  # the Debian package's folder
FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
INSTALL_HINT = ("fetch it with `rayfl data fetch fmnist` (into ~/.cache/rayfl-data/fmnist, read "
                "by default; or data.fetch: true), or install the Debian package with `sudo "
                f"apt-get install dataset-fashion-mnist` (into {DEFAULT_ROOT}), or set data.root "
                "to a directory holding the four IDX files")


def _refuse(path: str, problem: str) -> ConfigError:
    return ConfigError("data.root", path, f"an IDX file of unsigned bytes ({problem})")


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file (optionally gzipped): magic ``0 0 8 ndim``, then ``ndim`` big-endian
    sizes, then exactly their product of bytes; anything else is a ConfigError naming it."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise _refuse(path, f"{type(e).__name__}: {e}") from None
    if len(raw) < 4 or raw[:3] != b"\0\0\x08" or not 1 <= raw[3] <= 4:
        raise _refuse(path, f"it starts {raw[:4].hex(' ') or 'empty'}, not 00 00 08 and a "
                            "dimension count of 1 to 4")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise _refuse(path, f"it ends inside its header ({len(raw)} bytes)")
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(int)
    need = int(np.prod(dims))
    if len(raw) - 4 - 4 * ndim != need:
        raise _refuse(path, f"its header says {'×'.join(map(str, dims))} = {need} values, the "
                            f"file holds {len(raw) - 4 - 4 * ndim}")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def read_pair(images_path: str, labels_path: str, classes: int, first: int = 0,
              side: int = 28) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 rows of side² pixels, int64 labels ``first..first+classes-1`` shifted to 0..) of an
    images file and its labels file, each checked: a ConfigError names the file that is wrong."""
    x, y = read_idx(images_path), read_idx(labels_path)
    if x.ndim != 3 or x.shape[1:] != (side, side):
        raise ConfigError("data.root", images_path, f"IDX images of {side}×{side} pixels (its "
                          f"header says {'×'.join(map(str, x.shape))})")
    if y.ndim != 1:
        raise ConfigError("data.root", labels_path, f"IDX labels, one per image (its header "
                          f"says {'×'.join(map(str, y.shape))})")
    if len(x) != len(y):
        raise ConfigError("data.root", labels_path, f"as many labels as its images file "
                          f"{os.path.basename(images_path)} has images ({len(y)} labels, "
                          f"{len(x)} images)")
    bad = (y < first) | (y >= first + classes)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError("data.root", labels_path, f"labels in {first}..{first + classes - 1} "
                          f"(label {int(y[i])} at row {i})")
    return x.reshape(len(x), -1), y.astype(np.int64) - first


def find(root: str, stem: str) -> str | None:
    """The IDX file ``stem`` in ``root``, plain or gzipped."""
    for name in (stem + ".gz", stem):
        if os.path.isfile(os.path.join(root, name)):
            return os.path.join(root, name)
    return None


def default_root() -> str:
    """The Debian package's folder, else the folder ``rayfl data fetch fmnist`` fills when that
    one holds the four files (the Debian one when neither does)."""
    debian = SOURCES["fmnist"].system
    whole = [r for r in (debian, default_folder("fmnist"))
             if all(find(r, stem) for stem in FILES.values())]
    return whole[0] if whole else debian


def check_files(root: str | None) -> str:
    """The dataset directory, or a ConfigError naming what is missing and how to install it."""
    root = os.path.expanduser(root or default_root())
    missing = [stem for stem in FILES.values() if find(root, stem) is None]
    if missing:
        raise ConfigError("data.root", root, f"a directory with Fashion-MNIST's "
                          f"{', '.join(m + '[.gz]' for m in missing)}; {INSTALL_HINT}")
    return root


def sources(cfg) -> list[str]:
    """The four IDX files that :func:`load` reads (those present)."""
    root = os.path.expanduser(cfg.root or default_root())
    return [p for p in (find(root, stem) for stem in FILES.values()) if p]


def load(cfg, seed: int) -> Arrays:
    """Fashion-MNIST as uint8 rows of 784 pixels (scaled to [0, 1] for the model)."""
    root = check_files(cfg.root)
    f = {k: find(root, stem) for k, stem in FILES.items()}
    x_train, y_train = read_pair(f["x_train"], f["y_train"], 10)
    x_test, y_test = read_pair(f["x_test"], f["y_test"], 10)
    return Arrays(x_train, y_train, x_test, y_test, input_shape=(1, 28, 28), num_classes=10,
                  scale=1 / 255)
