"""A server wrapper that reads its clients' losses: the clients' learning rate is cut when the
round's training loss stops improving (torch's ReduceLROnPlateau, mode min, relative threshold).

Its client half asks every client for its mean training loss (summed, weighted like the
update, into the wrapper's own sums); its server half keeps the best loss so far and the rounds
since it improved in its slot, and multiplies the clients' learning rate by ``factor`` after
``patience`` rounds without a relative improvement of ``threshold``. Around any algorithm:

    rayfl run configs/test/tiny.yaml "layers=[{name: examples.plateau:ReduceOnPlateau}]"

``factor: 1`` never changes the rate: the run is the wrapped algorithm's, byte for byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.schema import field


@dataclass(frozen=True)
class PlateauParams:
    factor: float = field(0.5, doc="the clients' learning rate is multiplied by this on a "
                                   "plateau", lo=0.0, hi=1.0, lo_open=True)
    patience: int = field(3, doc="rounds without improvement before the rate is cut", lo=0)
    threshold: float = field(1e-4, doc="relative improvement of the loss that counts", lo=0.0)


@dataclass(frozen=True)
class Plateau:
    """The best round loss so far, the rounds since it improved, the learning-rate scale."""

    best: float
    bad: int
    scale: float


class ReduceOnPlateau(ServerWrapper):
    """η_l ← factor · η_l after ``patience`` rounds whose loss is not below
    best · (1 − threshold)."""

    Params = PlateauParams

    def init(self, x0):
        return Plateau(math.inf, 0, 1.0)

    def client_apply(self, delta, t, client, ctx):
        if math.isfinite(ctx.loss):  # the client's mean training loss, weighted like Δ_i
            ctx.payload["loss"] = ctx.weight * ctx.loss
            ctx.payload["weight"] = ctx.weight
        return delta

    def aggregate(self, slot, agg, sums, srv):
        if not sums.get("weight"):
            return agg, slot, {}
        loss = sums["loss"] / sums["weight"]
        best, bad, scale = slot.best, slot.bad + 1, slot.scale
        if loss < best * (1 - self.p.threshold):
            best, bad = loss, 0
        if bad > self.p.patience:
            scale, bad = scale * self.p.factor, 0
        return agg, Plateau(best, bad, scale), {"plateau_loss": loss, "plateau_lr_scale": scale}

    def client_lr(self, slot, t, inner):
        return inner(t) * slot.scale
