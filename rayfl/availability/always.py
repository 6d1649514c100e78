"""``always``: every registered client is online at every moment (plain uniform sampling)."""

from __future__ import annotations

import numpy as np

from rayfl.availability.base import AvailabilityModel


class AlwaysOn(AvailabilityModel):
    """Everyone is online; ``None`` tells the sampler to draw from all N without a mask."""

    def __init__(self):
        pass

    @classmethod
    def build(cls, cfg, ctx) -> "AlwaysOn":
        return cls()

    def online(self, t: int, now: float) -> np.ndarray | None:
        return None
