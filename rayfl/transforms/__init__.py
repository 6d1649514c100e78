"""Aggregation transforms: steps every client update, and then the round's sum, pass through.

A transform sees each client's update Δ_i inside the worker that trained it (``client``), before
it is summed, and the round's :class:`Aggregate` at the server (``aggregate``), before the
algorithm's server update. Transforms run in the order of ``aggregation.transforms``, so they
compose with every algorithm: this is where clipping, noise, quantisation, compression and
secure-aggregation arithmetic plug in. A transform is a class with a ``Params`` dataclass (its
config keys) registered in :data:`REGISTRY`; randomness must come from generators keyed by
(seed, round, client, purpose) so results stay independent of placement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rayfl import schema
from rayfl.algorithms.base import Aggregate, Vec
from rayfl.schema import ConfigError


@dataclass(frozen=True)
class NoParams:
    """A transform without settings."""


class Transform:
    """Identity by default; subclasses override what they change."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams

    def __init__(self, params: Any = None, seed: int = 0):
        self.p = params if params is not None else self.Params()
        self.seed = seed

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        """Client ``client``'s update Δ_i of round ``t`` as it is summed."""
        return delta

    def aggregate(self, agg: Aggregate, t: int) -> Aggregate:
        """The round's aggregate as the server algorithm sees it."""
        return agg


class Identity(Transform):
    """Leaves every update and the sum unchanged."""

    name = "identity"


@dataclass(frozen=True)
class ClipParams:
    """Per-client update-norm clipping."""

    max_norm: float = schema.field(1.0, doc="S: each client update Δ_i is scaled to ‖Δ_i‖ ≤ S",
                                   lo=0.0, lo_open=True)


class ClipUpdate(Transform):
    """Δ_i ← Δ_i · min(1, S / (‖Δ_i‖ + 1e-6)) (``torch.nn.utils.clip_grad_norm_``'s rule), the
    user-level clipping of DP-FedAvg; a client's own state still sees its unclipped model."""

    name = "clip"
    Params = ClipParams

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        norm = torch.linalg.vector_norm(delta)
        return delta * torch.clamp(self.p.max_norm / (norm + 1e-6), max=1.0)


REGISTRY: dict[str, type[Transform]] = {"identity": Identity, "clip": ClipUpdate}


class Chain:
    """Transforms applied in order."""

    def __init__(self, steps: list[Transform]):
        self.steps = steps

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        for step in self.steps:
            delta = step.client(delta, t, client)
        return delta

    def aggregate(self, agg: Aggregate, t: int) -> Aggregate:
        for step in self.steps:
            agg = step.aggregate(agg, t)
        return agg


def validate(entries: list[dict], key: str = "aggregation.transforms") -> list[dict]:
    """Check every ``{name: ..., <params>}`` entry (ConfigError naming the bad key)."""
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        name = entry.get("name")
        if name not in REGISTRY:
            raise ConfigError(f"{where}.name", name, "one of " + ", ".join(sorted(REGISTRY)))
        schema.build(REGISTRY[name].Params, {k: v for k, v in entry.items() if k != "name"},
                     where)
    return entries


def transforms_from_config(cfg) -> Chain | None:
    """The configured chain, DP-FedAvg's mechanism last when ``privacy`` is set (None: empty)."""
    steps = []
    for entry in cfg.aggregation.transforms:
        cls = REGISTRY[entry["name"]]
        params = schema.build(cls.Params, {k: v for k, v in entry.items() if k != "name"})
        steps.append(cls(params, cfg.seed))
    if cfg.privacy is not None:
        from rayfl.transforms.dp import GaussianDP, GaussianDPParams

        p = cfg.privacy
        steps.append(GaussianDP(GaussianDPParams(p.noise_multiplier, p.clip_norm,
                                                 cfg.clients_per_round), cfg.seed))
    return Chain(steps) if steps else None
