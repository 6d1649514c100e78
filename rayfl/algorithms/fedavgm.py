"""FedAvgM — server momentum (Hsu, Qi & Brown, 2019, "Measuring the Effects of Non-Identical
Data Distribution for Federated Visual Classification").

Clients run plain local SGD (as FedAvg). Server, with Δ̄ the weighted mean pseudo-gradient:
    m ← β m + Δ̄;   x ← x − η_g m              (heavy ball)
    x ← x − η_g (Δ̄ + β m)                     (nesterov: PyTorch's SGD(nesterov=True) form)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl import schema
from rayfl.algorithms.base import Aggregate, Algorithm, ServerParams, State, Vec


@dataclass(frozen=True)
class FedAvgMParams(ServerParams):
    """FedAvgM hyper-parameters."""

    momentum: float = schema.field(0.9, doc="server momentum β", lo=0.0, hi=1.0, hi_open=True)
    nesterov: bool = schema.field(False, doc="Nesterov look-ahead: x ← x − η_g (Δ̄ + β m)")


class FedAvgM(Algorithm):
    """Server state: the momentum buffer m (init 0)."""

    name = "fedavgm"
    Params = FedAvgMParams

    def server_init(self, x0: Vec) -> State:
        return {"x": x0.clone(), "m": torch.zeros_like(x0)}

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        if agg.count == 0:
            return state, {}
        beta = self.p.momentum
        m = beta * state["m"] + agg.delta_mean  # m ← β m + Δ̄
        step = agg.delta_mean + beta * m if self.p.nesterov else m
        new = {**state, "m": m, "x": state["x"] - self.server_lr * step}
        return new, {"momentum_norm": float(m.norm())}
