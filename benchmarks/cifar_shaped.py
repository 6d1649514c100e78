"""CIFAR-shaped synthetic images for the throughput benchmark: 3×32×32 uint8 pixels whose mean
depends on the label, ``data.samples_per_client`` rows a client on average (nothing to download;
only the shape and the cost per step matter here)."""

from __future__ import annotations

import numpy as np

from rayfl.data.datasets import Arrays

SHAPE = (3, 32, 32)


class CifarShaped:
    """``data.num_clients × data.samples_per_client`` training rows, ``data.test_samples`` test
    rows, ``data.classes`` labels."""

    @staticmethod
    def load(cfg, seed: int) -> Arrays:
        rng = np.random.default_rng([seed, 0xC1FA])
        pixels = int(np.prod(SHAPE))

        def draw(n: int):
            y = rng.integers(cfg.classes, size=n)
            x = rng.integers(0, 128, size=(n, pixels), dtype=np.uint8) + (y * 12)[:, None]
            return x.astype(np.uint8), y.astype(np.int64)

        x_train, y_train = draw(cfg.num_clients * cfg.samples_per_client)
        x_test, y_test = draw(cfg.test_samples)
        return Arrays(x_train, y_train, x_test, y_test, input_shape=SHAPE,
                      num_classes=cfg.classes, scale=1 / 255)
