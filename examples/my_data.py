"""A custom dataset: concentric rings in the plane, class k at radius k + 1.

Run it: ``rayfl run configs/test/tiny.yaml data.dataset=examples.my_data:Rings data.noise=0.2``
(``data.classes``, ``data.num_clients``, ``data.samples_per_client`` and ``data.test_samples``
size it, as for the built-in synthetic set; ``data.noise`` is its own key).
"""

from dataclasses import dataclass

import numpy as np

from rayfl import schema
from rayfl.data.datasets import Arrays


class Rings:
    """Concentric rings: class k lies on the circle of radius k + 1, plus Gaussian noise."""

    @dataclass(frozen=True)
    class Params:
        noise: float = schema.field(0.1, doc="standard deviation of the radial noise", lo=0.0)

    @staticmethod
    def load(cfg, seed):
        rng = np.random.default_rng([seed, 0x7199])

        def draw(n):
            y = rng.integers(cfg.classes, size=n)
            angle = rng.uniform(0, 2 * np.pi, size=n)
            radius = y + 1 + cfg.params.noise * rng.normal(size=n)
            x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], 1)
            return x.astype(np.float32), y.astype(np.int64)

        x_train, y_train = draw(cfg.num_clients * cfg.samples_per_client)
        x_test, y_test = draw(cfg.test_samples)
        return Arrays(x_train, y_train, x_test, y_test, input_shape=(2,),
                      num_classes=cfg.classes)
