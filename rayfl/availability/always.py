"""``always``: every registered client is online at every moment (plain uniform sampling)."""

from __future__ import annotations

import numpy as np


class AlwaysOn:
    """Everyone is online; ``None`` tells the sampler to draw from all N without a mask."""

    def online(self, t: int, now: float) -> np.ndarray | None:
        return None
