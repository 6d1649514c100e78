"""A synthetic classification set: Gaussian class clusters, deterministic from the seed."""

from __future__ import annotations

import numpy as np

from rayfl.rng import SYNTHETIC, stream

from rayfl.data.datasets import Arrays
from rayfl.schema import ConfigError

CHUNK = 1 << 18  # rows drawn at a time


def check_section(cfg, prefix: str) -> None:
    """A Dirichlet split can give every client ``min_samples`` only if the mean allows it."""
    if cfg.partition == "dirichlet" and cfg.min_samples > cfg.samples_per_client:
        raise ConfigError(f"{prefix}.min_samples", cfg.min_samples,
                          f"at most data.samples_per_client = {cfg.samples_per_client}")


def load(cfg, seed: int) -> Arrays:
    """``data.classes`` Gaussian blobs in ``data.features`` dimensions with unit noise, with
    ``num_clients × samples_per_client`` training rows."""
    features, classes, test_samples = cfg.features, cfg.classes, cfg.test_samples
    train_samples = cfg.num_clients * cfg.samples_per_client
    rng = stream(seed, SYNTHETIC)
    means = rng.normal(0.0, 1.0, size=(classes, features)).astype(np.float32) * 0.4

    def draw(n: int, part: int):
        r = stream(seed, part)
        y = r.integers(0, classes, size=n)
        x = np.empty((n, features), dtype=np.float32)
        for lo in range(0, n, CHUNK):  # the same stream as one draw, at a fraction of the memory
            hi = min(lo + CHUNK, n)
            x[lo:hi] = means[y[lo:hi]] + r.normal(0.0, 1.0, size=(hi - lo, features)).astype(
                np.float32)
        return x, y.astype(np.int64)

    x_tr, y_tr = draw(train_samples, 1)
    x_te, y_te = draw(test_samples, 2)
    return Arrays(x_tr, y_tr, x_te, y_te, input_shape=(features,), num_classes=classes)
