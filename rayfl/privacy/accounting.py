"""ε of a run's mechanism after t rounds, worst case and per client, from ``dp-accounting``.

DP-FedAvg's ε rests on amplification by sampling (:mod:`rayfl.privacy.fedavg`). DP-FTRL and
banded MF release one Gaussian mechanism over the whole run: noise σ = z·S per released entry
(a tree node, a row of C G) and an L2 sensitivity S·sqrt(s²) set by the participation schema,
so ε at δ is the Gaussian mechanism's with noise multiplier z / sqrt(s²). The worst case s²
after t rounds is :func:`rayfl.privacy.tree.max_sensitivity_squared` (tree) or min(k, ⌈t/b⌉)
(banded, columns of norm 1); a client's own s² comes from the rounds it took part in. When each
client takes part in at most one leaf per tree (restarts every ≤ b rounds, or k = 1), the RDP
accountant composes dp-accounting's ``SingleEpochTreeAggregationDpEvent`` for the tree, once
per participation (Kairouz et al., Appendix D), instead of the equivalent Gaussian event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rayfl.deferred import deferred
from rayfl.privacy import fedavg, tree
from rayfl.privacy.participation import Schema

dpa, pld, rdp = (deferred(f"dp_accounting{m}") for m in ("", ".pld", ".rdp"))


@dataclass(frozen=True)
class FedAvgAccountant:
    """DP-FedAvg's accountant: the sampled Gaussian mechanism composed over the rounds."""

    kwargs: dict

    def epsilon(self, rounds: int) -> float:
        """ε after ``rounds`` rounds at the configured δ."""
        return fedavg.epsilon(rounds, **self.kwargs)

    def rounds_within(self, target: float, limit: int) -> int:
        """The most rounds (≤ ``limit``) whose ε stays ≤ ``target``."""
        return fedavg.rounds_within(target, limit, **self.kwargs)


@dataclass(frozen=True)
class CorrelatedAccountant:
    """DP-FTRL's (``dp_ftrl``) or banded MF's (``banded_mf``) accountant for a schema."""

    mechanism: str
    noise_multiplier: float
    delta: float
    schema: Schema
    restart: int | None = None
    accountant: str = "rdp"
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def sensitivity_squared(self, horizon: int) -> float:
        """The worst case s² over the schema within the first ``horizon`` rounds."""
        if self.mechanism == "banded_mf":
            return float(self.schema.bound(horizon))
        return tree.max_sensitivity_squared(horizon, self.schema.min_separation,
                                            self.schema.max_participations, self.restart)

    def one_leaf_per_tree(self, horizon: int) -> bool:
        """Whether no client can take part twice in one tree within ``horizon`` rounds."""
        return self.mechanism == "dp_ftrl" and (
            self.schema.bound(horizon) <= 1 or
            (self.restart is not None and self.restart <= self.schema.min_separation))

    def tree_event(self, horizon: int) -> dpa.DpEvent:
        """k_t single-epoch tree events of min(restart, t) steps (k_t the participations
        possible in t rounds): what dp-accounting states for one leaf per tree."""
        steps = horizon if self.restart is None else min(self.restart, horizon)
        return dpa.SelfComposedDpEvent(
            dpa.SingleEpochTreeAggregationDpEvent(self.noise_multiplier, steps),
            self.schema.bound(horizon))

    def epsilon(self, rounds: int) -> float:
        """The worst-case ε after ``rounds`` rounds (0 rounds: 0; no noise: inf)."""
        if rounds <= 0:
            return 0.0
        if self.noise_multiplier <= 0:
            return math.inf
        if self.accountant == "rdp" and self.one_leaf_per_tree(rounds):
            acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
            acc.compose(self.tree_event(rounds))
            return float(acc.get_epsilon(self.delta))
        return self.gaussian_epsilon(self.sensitivity_squared(rounds))

    def gaussian_epsilon(self, sensitivity_squared: float) -> float:
        """ε of the Gaussian mechanism with noise multiplier z / sqrt(s²) (cached by s²)."""
        if sensitivity_squared <= 0:
            return 0.0
        if self.noise_multiplier <= 0:
            return math.inf
        key = float(sensitivity_squared)
        if key not in self._cache:
            event = dpa.GaussianDpEvent(self.noise_multiplier / math.sqrt(key))
            acc = rdp.RdpAccountant() if self.accountant == "rdp" else pld.PLDAccountant()
            acc.compose(event)
            self._cache[key] = float(acc.get_epsilon(self.delta))
        return self._cache[key]

    def individual(self, rounds: list[np.ndarray], horizon: int) -> np.ndarray:
        """Each client's ε from the rounds (0-based) it took part in during ``horizon`` rounds.

        Banded MF counts every participation as a column of norm 1 (exact but for the last
        b − 1 rounds, whose columns the horizon shortens: an upper bound there)."""
        if self.mechanism == "banded_mf":
            s2 = [float(np.count_nonzero(np.asarray(r) < horizon)) for r in rounds]
        else:
            s2 = [float(tree.sensitivity_squared(r, horizon, self.restart)) for r in rounds]
        return np.array([self.gaussian_epsilon(s) for s in s2], dtype=np.float64)

    def rounds_within(self, target: float, limit: int) -> int:
        """The most rounds (≤ ``limit``) whose worst-case ε stays ≤ ``target``."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.epsilon(mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo


def schema_of(p) -> Schema:
    """The participation schema of a ``privacy`` section (dp_ftrl: b = 1 unless set; banded_mf:
    b = bands unless set)."""
    b = p.min_separation
    if b is None:
        b = p.bands if p.mechanism == "banded_mf" and p.bands is not None else 1
    return Schema(b, p.max_participations)


def bands_of(p) -> int:
    """banded_mf's b (``bands``, or ``min_separation`` when unset)."""
    return p.bands if p.bands is not None else p.min_separation


def accountant_of(privacy, num_clients: int, clients_per_round: int,
                  noise_multiplier: float | None = None
                  ) -> FedAvgAccountant | CorrelatedAccountant:
    """The accountant of a ``privacy`` section over ``num_clients`` training clients and
    ``clients_per_round`` a round (``noise_multiplier`` overrides the configured z)."""
    p = privacy
    z = p.noise_multiplier if noise_multiplier is None else noise_multiplier
    if p.mechanism == "dp_fedavg":
        return FedAvgAccountant({"delta": p.delta, "sampling": p.sampling,
                                 "accountant": p.accountant, "num_clients": num_clients,
                                 "per_round": clients_per_round, "noise_multiplier": z})
    return CorrelatedAccountant(p.mechanism, z, p.delta, schema_of(p), p.restart, p.accountant)


def accountant(cfg, noise_multiplier: float | None = None):
    """The accountant of a run config with a ``privacy`` section (``noise_multiplier``
    overrides the configured z)."""
    return accountant_of(cfg.privacy, cfg.data.num_clients - cfg.data.validation_clients,
                         cfg.clients_per_round, noise_multiplier)


def calibrate(cfg, target_epsilon: float, rounds: int | None = None,
              tolerance: float = 1e-4) -> float:
    """The smallest noise multiplier z (to a relative ``tolerance``) whose worst-case ε after
    ``rounds`` (default: the config's) stays within ``target_epsilon`` (bisection on log z)."""
    rounds = cfg.rounds if rounds is None else rounds
    lo, hi = 1e-3, 1e3
    if accountant(cfg, hi).epsilon(rounds) > target_epsilon:
        raise ValueError(f"no noise multiplier up to {hi:g} reaches ε = {target_epsilon:g}")
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        if accountant(cfg, mid).epsilon(rounds) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi
