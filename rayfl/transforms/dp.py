"""DP-FedAvg's Gaussian mechanism as an aggregation transform (see :mod:`rayfl.privacy`).

Client side: Δ_i ← Δ_i · min(1, S / ‖Δ_i‖) (every client's contribution has norm ≤ S). Server
side: Δ̄ = (Σ_i Δ_i + N(0, z²S² I)) / K with K the expected number of participants, whatever the
number that completed (the fixed-denominator estimator; weights are 1). The noise comes from a
generator keyed by (seed, round), so a resumed run adds the same noise. Per-client quantities
the runtime would otherwise report from the round's sums (Σ‖Δ_i‖², the unnoised count) are
withheld from the algorithm: ``delta_sq_sum`` is NaN and ``weight_sum`` is K.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from rayfl import schema
from rayfl.algorithms.base import Aggregate, Vec
from rayfl.transforms import Transform

NOISE_STREAM = 0xD9  # purpose tag of the noise generator


@dataclass(frozen=True)
class GaussianDPParams:
    """The Gaussian mechanism's settings (from the ``privacy`` section)."""

    noise_multiplier: float = schema.field(1.0, doc="z: noise std is z·S", lo=0.0)
    clip_norm: float = schema.field(1.0, doc="S: per-client update norm bound", lo=0.0,
                                    lo_open=True)
    expected_clients: int = schema.field(1, doc="K: the fixed denominator", lo=1)


class GaussianDP(Transform):
    """Clip each client update to S; add N(0, (zS)²) to the sum; divide by K."""

    name = "dp_gaussian"
    Params = GaussianDPParams

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        norm = float(torch.linalg.vector_norm(delta.double()))
        return delta if norm <= self.p.clip_norm else delta * (self.p.clip_norm / norm)

    def noise(self, t: int, dim: int) -> np.ndarray:
        """Round t's noise vector (float64), std z·S per coordinate."""
        rng = np.random.default_rng([self.seed, t, NOISE_STREAM])
        return rng.standard_normal(dim) * (self.p.noise_multiplier * self.p.clip_norm)

    def aggregate(self, agg: Aggregate, t: int) -> Aggregate:
        k = float(self.p.expected_clients)
        noisy = agg.delta_sum + torch.from_numpy(self.noise(t, agg.delta_sum.numel())).to(
            agg.delta_sum.dtype)
        return dataclasses.replace(agg, delta_sum=noisy, delta_mean=noisy / k, weight_sum=k,
                                   delta_sq_sum=float("nan"))
