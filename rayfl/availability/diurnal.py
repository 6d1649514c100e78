"""``diurnal``: clients live in time zones; online probability follows a daily curve by zone.

Zone z's local hour is UTC + 24·z/zones. The probability at local hour h is
``mean·(1 + amplitude·cos(2π(h − peak_hour)/24))``. With ``correlate: label`` the zone follows
the client's dominant label, so the labels on offer rotate through the day: period drift.
"""

from __future__ import annotations

import numpy as np

from rayfl.availability.base import AvailabilityModel
from rayfl.rng import ONLINE, ZONE, stream
from rayfl.availability.config import AvailabilityConfig
from rayfl.schema import ConfigError


class Diurnal(AvailabilityModel):
    """Per-round coin flips with the probability of the client's zone at the round's start."""

    def __init__(self, cfg: AvailabilityConfig, n: int, seed: int, ranks: np.ndarray | None,
                 num_classes: int):
        if ranks is None:
            zone = stream(seed, ZONE).integers(cfg.zones, size=n)
        else:
            zone = ranks.astype(np.int64) * cfg.zones // num_classes
        self.zone = zone.astype(np.int32)
        self.offset_h = 24.0 * np.arange(cfg.zones) / cfg.zones
        self.mean, self.amplitude, self.peak = cfg.mean, cfg.amplitude, cfg.peak_hour
        self.seed = seed

    @staticmethod
    def check_section(cfg: AvailabilityConfig, prefix: str) -> None:
        """The peak probability mean·(1 + amplitude) is a probability."""
        if cfg.mean * (1 + cfg.amplitude) > 1 + 1e-12:
            raise ConfigError(f"{prefix}.amplitude", cfg.amplitude,
                              f"at most 1/mean − 1 = {1 / cfg.mean - 1:.4g} so that the peak "
                              "probability mean·(1 + amplitude) stays ≤ 1")

    @classmethod
    def build(cls, cfg: AvailabilityConfig, ctx) -> "Diurnal":
        return cls(cfg, ctx.num_clients, ctx.seed, ctx.ranks(), ctx.num_classes)

    def curve(self, now: float) -> np.ndarray:
        """Online probability of every zone at virtual time ``now`` (seconds; 0 = midnight UTC)."""
        local = (now / 3600.0 + self.offset_h) % 24.0
        return self.mean * (1 + self.amplitude * np.cos(2 * np.pi * (local - self.peak) / 24))

    def online(self, t: int, now: float) -> np.ndarray:
        p = self.curve(now).astype(np.float32)[self.zone]
        return stream(self.seed, t, ONLINE).random(p.size, dtype=np.float32) < p
