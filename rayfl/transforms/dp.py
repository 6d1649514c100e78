"""DP-FedAvg's Gaussian mechanism as an aggregation transform (see :mod:`rayfl.privacy`), and
DP-FTRL's and banded MF's correlated noise as its subclass :class:`CorrelatedDP`.

Client side: Δ_i ← Δ_i · min(1, S / ‖Δ_i‖) (every client's contribution has norm ≤ S). Server
side: Δ̄ = (Σ_i Δ_i + N(0, z²S² I)) / K with K the expected number of participants, whatever the
number that completed (the fixed-denominator estimator; weights are 1). The noise comes from a
generator keyed by (seed, round), so a resumed run adds the same noise. Per-client quantities
the runtime would otherwise report from the round's sums (Σ‖Δ_i‖², the unnoised count) are
withheld from the algorithm: ``delta_sq_sum`` is NaN and ``weight_sum`` is K.

Adaptive clipping (Andrew et al., NeurIPS 2021, geometric update): S is server state S_t sent to
the clients with the model; each client also reports b_i − ½ with b_i = 1[‖Δ_i‖ ≤ S_t] (sensitivity ½); the
server forms b̃ = (Σ (b_i − ½) + N(0, σ_b²)) / K + ½ (K the expected count, as for the update)
and sets S_{t+1} = S_t · exp(−η_C (b̃ − γ)), so S tracks the γ quantile of the update norms. The update's noise multiplier becomes z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2),
so the pair of Gaussian releases costs exactly what one Gaussian mechanism with multiplier z
costs (the paper's Theorem 1): the accountant's ε for z stays correct.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from rayfl import schema
from rayfl.algorithms.base import Aggregate, Vec
from rayfl.transforms import ClientContext, Transform

if TYPE_CHECKING:
    from rayfl.privacy.banded import BandedNoise
    from rayfl.privacy.tree import TreeNoise

NOISE_STREAM = 0xD9  # purpose tag of the update noise generator
COUNT_STREAM = 0xDA  # purpose tag of the clipped-count noise generator


@dataclass(frozen=True)
class GaussianDPParams:
    """The Gaussian mechanism's settings (from the ``privacy`` section)."""

    noise_multiplier: float = schema.field(1.0, doc="z: noise std is z·S", lo=0.0)
    clip_norm: float = schema.field(1.0, doc="S: per-client update norm bound (the initial S "
                                             "with adaptive clipping)", lo=0.0, lo_open=True)
    expected_clients: int = schema.field(1, doc="K: the fixed denominator", lo=1)
    target_quantile: float | None = schema.field(
        None, doc="γ: adaptive clipping's target quantile (None: S stays fixed)", lo=0.0, hi=1.0)
    clip_lr: float = schema.field(0.2, doc="η_C: geometric step of the clip norm", lo=0.0)
    count_noise: float | None = schema.field(
        None, doc="σ_b: noise std on the clipped count (None: K/20, the paper's choice)",
        lo=0.0, lo_open=True)


def update_noise_multiplier(z: float, count_noise: float) -> float:
    """z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the update's multiplier when the count takes its share."""
    rest = z ** -2 - (2 * count_noise) ** -2
    return math.inf if rest <= 0 else rest ** -0.5


class GaussianDP(Transform):
    """Clip each client update to S; add N(0, (zS)²) to the sum; divide by K."""

    name = "dp_gaussian"
    Params = GaussianDPParams

    def __init__(self, params: GaussianDPParams | None = None, seed: int = 0):
        super().__init__(params, seed)
        self.clip = self.p.clip_norm  # S_t (server state when adaptive)
        self.used = self.clip  # S of the round just aggregated

    @classmethod
    def from_privacy(cls, cfg) -> GaussianDP:
        """The mechanism of a run's ``privacy`` section (:class:`CorrelatedDP` for dp_ftrl and
        banded_mf)."""
        p, ad = cfg.privacy, cfg.privacy.adaptive_clip
        if p.mechanism != "dp_fedavg":
            return CorrelatedDP.from_privacy(cfg)
        return cls(GaussianDPParams(
            p.noise_multiplier, p.clip_norm, cfg.clients_per_round,
            None if ad is None else ad.target_quantile, 0.2 if ad is None else ad.learning_rate,
            None if ad is None else ad.count_noise), cfg.seed)

    @property
    def adaptive(self) -> bool:
        return self.p.target_quantile is not None

    @property
    def count_noise(self) -> float:
        """σ_b (K/20 unless set)."""
        return self.p.count_noise if self.p.count_noise is not None else \
            self.p.expected_clients / 20

    @property
    def update_multiplier(self) -> float:
        """The multiplier of the update's noise: z, or z_Δ with adaptive clipping."""
        z = self.p.noise_multiplier
        return update_noise_multiplier(z, self.count_noise) if self.adaptive and z > 0 else z

    def broadcast(self, t: int) -> dict[str, Vec]:
        return {"clip_norm": torch.tensor([self.clip], dtype=torch.float64)} if self.adaptive \
            else {}

    def client_apply(self, delta: Vec, t: int, client: int, ctx: ClientContext) -> Vec:
        s = float(ctx.broadcast["clip_norm"][0]) if "clip_norm" in ctx.broadcast else \
            self.p.clip_norm
        norm = float(torch.linalg.vector_norm(delta.double()))
        if self.adaptive:
            ctx.payload["unclipped"] = 0.5 if norm <= s else -0.5  # b_i − ½
        return delta if norm <= s else delta * (s / norm)

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        return self.client_apply(delta, t, client, ClientContext())

    def noise(self, t: int, dim: int) -> np.ndarray:
        """Round t's noise vector (float64), std z·S per coordinate (z_Δ·S_t when adaptive)."""
        rng = np.random.default_rng([self.seed, t, NOISE_STREAM])
        return rng.standard_normal(dim) * (self.update_multiplier * self.clip)

    def count_estimate(self, centred: float, t: int) -> float:
        """b̃ = (Σ (b_i − ½) + N(0, σ_b²)) / K + ½."""
        rng = np.random.default_rng([self.seed, t, COUNT_STREAM])
        return (centred + rng.standard_normal() * self.count_noise) / self.p.expected_clients \
            + 0.5

    def aggregate(self, agg: Aggregate, t: int) -> Aggregate:
        k = float(self.p.expected_clients)
        noisy = agg.delta_sum + torch.from_numpy(self.noise(t, agg.delta_sum.numel())).to(
            agg.delta_sum.dtype)
        self.used = self.clip
        extras = dict(agg.extras)
        if self.adaptive:
            b = self.count_estimate(float(extras.pop("unclipped", 0.0)), t)
            self.clip = self.clip * math.exp(-self.p.clip_lr * (b - self.p.target_quantile))
        return dataclasses.replace(agg, delta_sum=noisy, delta_mean=noisy / k, weight_sum=k,
                                   delta_sq_sum=float("nan"), extras=extras)

    def metrics(self) -> dict[str, float]:
        return {"dp_clip_norm": self.used}

    def server_state(self) -> dict:
        return {"clip_norm": self.clip, "used": self.used}

    def load_server_state(self, state: dict) -> None:
        if "clip_norm" in state:  # (a fork may put the mechanism where another step was)
            self.clip, self.used = float(state["clip_norm"]), float(state["used"])


class CorrelatedDP(GaussianDP):
    """DP-FedAvg's clipping and fixed denominator, with noise correlated across rounds: round t's
    sum receives z·S times DP-FTRL's n_t − n_{t−1} (:class:`rayfl.privacy.tree.TreeNoise`) or
    banded MF's w_t = (C⁻¹Z)_t (:class:`rayfl.privacy.banded.BandedNoise`). The generator's
    state (the tree's O(log t) node values, or the last b − 1 noise vectors and C's bands) is
    server state: checkpointed, resumed and forked to the same bytes."""

    name = "dp_correlated"

    def __init__(self, params: GaussianDPParams, seed: int, source: TreeNoise | BandedNoise):
        super().__init__(params, seed)
        self.source = source

    @classmethod
    def from_privacy(cls, cfg) -> CorrelatedDP:
        from rayfl.privacy import bands_of
        from rayfl.privacy.banded import BandedNoise, coefficients
        from rayfl.privacy.tree import TreeNoise

        p = cfg.privacy
        if p.mechanism == "dp_ftrl":
            source = TreeNoise(cfg.seed, p.restart, p.honaker)
        else:
            source = BandedNoise(cfg.seed, coefficients(
                bands_of(p), p.band_coefficients or "optimized", cfg.rounds))
        return cls(GaussianDPParams(p.noise_multiplier, p.clip_norm, cfg.clients_per_round),
                   cfg.seed, source)

    def noise(self, t: int, dim: int) -> np.ndarray:
        """Round t's share of the correlated noise, std z·S per released entry."""
        return self.source.round_noise(t, dim) * (self.p.noise_multiplier * self.clip)

    def server_state(self) -> dict:
        return {**super().server_state(), "correlated": self.source.state()}

    def load_server_state(self, state: dict) -> None:
        super().load_server_state(state)
        if "correlated" in state:
            self.source.load_state(state["correlated"])
