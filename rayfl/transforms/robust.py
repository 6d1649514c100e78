"""Byzantine-robust aggregation rules and the attackers they are tested against.

A robust rule replaces the round's weighted mean Δ̄ by a statistic of the individual updates
Δ_1..Δ_m (as the clients sent them, after every client-side step), which the server must
hold at once: m × d numbers in the server's memory each round (100 clients of a 1.2 M-parameter
CNN: 480 MB in float32), where the mean needs d. Rules are unweighted, as in their papers.

- ``median``: coordinate-wise median (Yin et al., ICML 2018; even m: the mean of the middle two);
- ``trimmed_mean``: per coordinate, drop the ⌊βm⌋ largest and smallest values and average the
  rest (Yin et al., ICML 2018); β = 0 is the plain mean;
- ``krum``: the update whose summed squared distance to its m − f − 2 nearest others is least
  (Blanchard et al., NeurIPS 2017); with ``select: k > 1``, Multi-Krum: the mean of the k
  best-scored updates;
- norm bounding (Sun et al., 2019) is the ``clip`` step (each ‖Δ_i‖ ≤ M), which needs no
  update at once.

They read single updates, so they refuse secure aggregation and DP-FedAvg (which reveal or
privatise only the sum) and algorithms whose server reads other per-client sums (SCAFFOLD's
Δc_i would stay unprotected): the algorithm must be one whose server post-processes Δ̄.

``attack`` makes a seeded fraction of the clients Byzantine (client c attacks in every round it
takes part when a generator keyed by (seed, c) draws below ``fraction``): ``sign_flip`` sends
−Δ_i, ``scale`` sends s·Δ_i, ``gaussian`` sends N(0, σ²I) (noise keyed by seed, round, client).
Label flipping needs the data, not the update, and is not among them.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch

from rayfl import rng, schema
from rayfl.algorithms.base import Aggregate, Vec
from rayfl.layers import ClientContext, LayerTraits
from rayfl.schema import ConfigError, NoParams
from rayfl.transforms.base import Transform



class RobustRule(Transform, abc.ABC):
    """A server step that needs every update of the round (``needs_updates``)."""

    traits = LayerTraits(needs_updates=True)

    @abc.abstractmethod
    def rule(self, updates: torch.Tensor) -> Vec:
        """The robust estimate of the mean of ``updates`` (m × d)."""

    def aggregate(self, slot, agg: Aggregate, sums: dict, srv):
        if agg.count == 0:
            return agg, slot, {}
        mean = self.rule(agg.updates).to(agg.delta_mean.dtype)
        return dataclasses.replace(agg, delta_mean=mean), slot, {}


class Median(RobustRule):
    """Coordinate-wise median of the round's updates (Yin et al., ICML 2018)."""

    name = "median"
    Params = NoParams

    def rule(self, updates: torch.Tensor) -> Vec:
        m = len(updates)

        def median(block: torch.Tensor) -> Vec:
            s = block.sort(0).values
            return s[m // 2] if m % 2 else (s[m // 2 - 1] + s[m // 2]) / 2

        return _chunked(updates, median)


@dataclass(frozen=True)
class TrimmedMeanParams:
    """Coordinate-wise trimmed mean."""

    beta: float = schema.field(0.1, doc="β: the fraction of the largest and of the smallest "
                               "values dropped per coordinate (⌊βm⌋ each)", lo=0.0, hi=0.5,
                               hi_open=True)


class TrimmedMean(RobustRule):
    """Per coordinate, the mean of the values left after dropping ⌊βm⌋ at each end (Yin et
    al., ICML 2018)."""

    name = "trimmed_mean"
    Params = TrimmedMeanParams

    #: the tuner's preset ``trimmed_mean``: the trimmed fraction β
    traits = LayerTraits(needs_updates=True, search_space={
        "aggregation.transforms.trimmed_mean.beta": {"low": 0.0, "high": 0.4}})

    def rule(self, updates: torch.Tensor) -> Vec:
        m = len(updates)
        k = math.floor(self.p.beta * m)
        if k == 0:
            return updates.mean(0)
        return _chunked(updates, lambda u: u.sort(0).values[k:m - k].mean(0))


@dataclass(frozen=True)
class KrumParams:
    """Krum / Multi-Krum."""

    byzantine: int = schema.field(1, doc="f: the Byzantine clients tolerated (needs m > 2f + 2 "
                                  "updates: refused when the round's clients cannot give them; "
                                  "a round with fewer is the plain mean, counted in "
                                  "krum_fallbacks)", lo=0)
    select: int = schema.field(1, doc="k: 1 is Krum; k > 1 is Multi-Krum, the mean of the k "
                               "best-scored updates (at most m − f: refused above the round's "
                               "clients less f, clamped in a round with fewer, counted in "
                               "krum_clamped)", lo=1)


class Krum(RobustRule):
    """score(i) = Σ of ‖Δ_i − Δ_j‖² over i's m − f − 2 nearest others; the least-scored update
    (Multi-Krum: the mean of the ``select`` least-scored; Blanchard et al., NeurIPS 2017).

    Krum's guarantee needs m > 2f + 2 updates, and Multi-Krum's mean of k updates can be free of
    attackers only when k ≤ m − f: a config whose rounds can never meet either is refused; a
    round that falls short (dropped clients) takes the plain mean (``krum_fallbacks``) or averages
    its m − f best-scored updates (``krum_clamped``)."""

    name = "krum"
    Params = KrumParams

    #: the tuner's preset ``krum``: f and k (k = 1: Krum) for rounds of 10 clients
    traits = LayerTraits(needs_updates=True, search_space={
        "aggregation.transforms.krum.byzantine": {"type": "int", "low": 0, "high": 3},
        "aggregation.transforms.krum.select": {"type": "int", "low": 1, "high": 5}})

    @classmethod
    def check_config(cls, params, cfg, where: str) -> None:
        m, source = updates_per_step(cfg)
        f, k = params.byzantine, params.select
        if m <= 2 * f + 2:
            if cfg.aggregation.mode == "fedasync":
                raise ConfigError(*source, f"sync or fedbuff with {where} = krum (a fedasync "
                                           f"step holds one update; Krum needs m > 2f + 2)")
            if m < 3:
                raise ConfigError(*source, f"at least 3 with {where} = krum (Krum needs "
                                           f"m > 2f + 2 updates a step; fewer: always the mean)")
            raise ConfigError(f"{where}.byzantine", f,
                              f"at most {(m - 3) // 2} with {m} updates a step (Krum needs "
                              f"m > 2f + 2; every step would be the plain mean)")
        if k > m - f:
            raise ConfigError(f"{where}.select", k,
                              f"at most m − f = {m - f} with {m} updates a step and byzantine "
                              f"{f} (a mean of more than m − f updates includes an attacker "
                              f"whenever f attack)")

    def init(self, x0: Vec) -> KrumCounts:
        return KrumCounts()

    def fallback(self, m: int) -> bool:
        """Whether ``m`` updates are too few for Krum with f Byzantine (m ≤ 2f + 2)."""
        return m <= 2 * self.p.byzantine + 2

    def rule(self, updates: torch.Tensor) -> Vec:
        m, f = len(updates), self.p.byzantine
        if self.fallback(m):
            return updates.mean(0)
        d2 = torch.cdist(updates, updates).pow(2)
        nearest = d2.sort(1).values[:, 1:m - f - 1]  # column 0 is the update itself
        scores = nearest.sum(1)
        k = min(self.p.select, m - f)
        return updates[torch.argsort(scores, stable=True)[:k]].mean(0)

    def aggregate(self, slot: KrumCounts, agg: Aggregate, sums: dict, srv):
        m, f = agg.count, self.p.byzantine
        if m and self.fallback(m):
            slot = dataclasses.replace(slot, fallbacks=slot.fallbacks + 1)
        elif m and self.p.select > m - f:
            slot = dataclasses.replace(slot, clamped=slot.clamped + 1)
        agg, _, _ = super().aggregate(slot, agg, sums, srv)
        return agg, slot, {"krum_fallbacks": float(slot.fallbacks),
                           "krum_clamped": float(slot.clamped)}

    def from_legacy(self, old: dict) -> KrumCounts:
        """rayfl 0.1 kept no counts in its checkpoints."""
        return KrumCounts()


@dataclass(frozen=True)
class KrumCounts:
    """Krum's slot: rounds that fell back to the plain mean, rounds that averaged fewer than
    ``select`` updates."""

    fallbacks: int = 0
    clamped: int = 0


def updates_per_step(cfg) -> tuple[int, tuple[str, object]]:
    """The most updates one server step can see, and the config key that sets it: the round's
    clients, FedBuff's buffer, or FedAsync's single update."""
    mode = cfg.aggregation.mode
    if mode == "fedasync":
        return 1, ("aggregation.mode", mode)
    if mode == "fedbuff" and cfg.aggregation.buffer_size:
        return cfg.aggregation.buffer_size, ("aggregation.buffer_size",
                                             cfg.aggregation.buffer_size)
    return cfg.clients_per_round, ("clients_per_round", cfg.clients_per_round)


def _chunked(updates: torch.Tensor, fn, size: int = 1 << 16) -> Vec:
    """``fn`` over column blocks (sorting m × d at once would double the memory)."""
    return torch.cat([fn(updates[:, lo:lo + size]) for lo in range(0, updates.shape[1], size)])


@dataclass(frozen=True)
class AttackParams:
    """Byzantine clients."""

    kind: Literal["sign_flip", "scale", "gaussian", "label_flip"] = schema.field(
        "sign_flip", doc="sign_flip (−Δ_i), scale (s·Δ_i), gaussian (N(0, σ²I) instead of Δ_i) "
                         "or label_flip (the client trains honestly on labels C − 1 − y)")
    fraction: float = schema.field(0.1, doc="share of the clients that attack (a seeded set, "
                                   "the same every round)", lo=0.0, hi=1.0)
    scale: float = schema.field(-4.0, doc="s of kind scale")
    sigma: float = schema.field(1.0, doc="σ of kind gaussian", lo=0.0)


class Attack(Transform):
    """Byzantine clients for testing robust rules: client c attacks whenever it takes part when
    a generator keyed by (seed, c) draws below ``fraction``, sending a corrupted update."""

    name = "attack"
    Params = AttackParams
    traits = LayerTraits(public_reports=("attackers",))  # who attacks is the seed's choice

    def is_attacker(self, client: int) -> bool:
        return bool(rng.stream(self.seed, client, rng.ATTACKERS).random()
                    < self.p.fraction)

    def client_labels(self, labels: torch.Tensor, client: int, num_classes: int) -> torch.Tensor:
        if self.p.kind != "label_flip" or not self.is_attacker(client):
            return labels
        return num_classes - 1 - labels

    def client_apply(self, delta: Vec, t: int, client: int, ctx: ClientContext) -> Vec:
        if not self.is_attacker(client):
            return delta
        ctx.payload["attackers"] = 1.0
        if self.p.kind == "label_flip":  # its update is honest training on flipped labels
            return delta
        if self.p.kind == "sign_flip":
            return -delta
        if self.p.kind == "scale":
            return self.p.scale * delta
        noise = rng.client_stream(self.seed, t, client, rng.ATTACK_NOISE).standard_normal(
            delta.numel())
        return torch.from_numpy(noise * self.p.sigma).to(delta.dtype).to(delta.device)

    @classmethod
    def check_data(cls, params, handle, where: str) -> None:
        if params.kind == "label_flip" and handle.kind in ("tokens", "ids"):
            raise ConfigError(f"{where}.kind", params.kind,
                              "sign_flip, scale or gaussian on this dataset (label_flip needs "
                              f"class labels; {handle.kind} data has none)")

    def aggregate(self, slot, agg: Aggregate, sums: dict, srv):
        return agg, slot, {"attackers": float(sums.get("attackers", 0.0))}
