"""``bernoulli``: client i is online each round with its own Beta-distributed probability p_i.

Heterogeneous propensities make some clients participate far more than others; with
``correlate: label`` the propensities are ranked by dominant label, so some labels are
systematically over-represented in the participating population.
"""

from __future__ import annotations

import math

import numpy as np

from rayfl.availability.base import AvailabilityModel
from rayfl.rng import ONLINE, PROPENSITY, stream
from rayfl.availability.config import AvailabilityConfig
from rayfl.schema import ConfigError


def propensities(mean: float, spread: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n draws from the Beta distribution with this mean and standard deviation."""
    if spread == 0:
        return np.full(n, mean)
    k = mean * (1 - mean) / spread**2 - 1  # a + b
    return rng.beta(mean * k, (1 - mean) * k, size=n)


class Bernoulli(AvailabilityModel):
    """Independent per-round coin flips with per-client probabilities ``p``."""

    def __init__(self, cfg: AvailabilityConfig, n: int, seed: int, ranks: np.ndarray | None):
        rng = stream(seed, PROPENSITY)
        p = propensities(cfg.mean, cfg.spread, n, rng)
        if ranks is not None:  # lowest label rank gets the lowest probabilities
            order = np.lexsort((rng.random(n), ranks))
            p[order] = np.sort(p)
        self.p = p.astype(np.float32)
        self.seed = seed

    @staticmethod
    def check_section(cfg: AvailabilityConfig, prefix: str) -> None:
        """A Beta distribution with mean m has a standard deviation below sqrt(m (1 − m))."""
        limit = math.sqrt(cfg.mean * (1 - cfg.mean))
        if cfg.spread > 0 and cfg.spread >= limit:
            raise ConfigError(f"{prefix}.spread", cfg.spread,
                              f"less than sqrt(mean·(1 − mean)) = {limit:.4g} (a Beta "
                              f"distribution with mean {cfg.mean} cannot spread more)")

    @classmethod
    def build(cls, cfg: AvailabilityConfig, ctx) -> "Bernoulli":
        return cls(cfg, ctx.num_clients, ctx.seed, ctx.ranks())

    def online(self, t: int, now: float) -> np.ndarray:
        rng = stream(self.seed, t, ONLINE)
        return rng.random(self.p.size, dtype=np.float32) < self.p
