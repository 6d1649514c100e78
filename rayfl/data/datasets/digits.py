"""scikit-learn's bundled 8×8 digits (1,797 images); sklearn is imported only when used."""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from rayfl.data.datasets import Arrays
from rayfl.schema import ConfigError


def sources(cfg) -> list[str]:
    """scikit-learn's bundled ``digits.csv.gz`` (found without importing scikit-learn)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [os.path.join(spec.submodule_search_locations[0], "datasets", "data",
                         "digits.csv.gz")]


def load(cfg, seed: int) -> Arrays:
    """Pixels 0..16 as uint8 (scaled to [0, 1]); every fifth image is test, the rest train."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ConfigError("data.dataset", cfg.dataset, "scikit-learn installed for the digits "
                          "dataset (pip install scikit-learn, or rayfl[test])") from None
    d = load_digits()
    x, y = d.data.astype(np.uint8), d.target.astype(np.int64)
    test = np.arange(len(y)) % 5 == 4
    return Arrays(x[~test], y[~test], x[test], y[test], input_shape=(1, 8, 8), num_classes=10,
                  scale=1 / 16)
