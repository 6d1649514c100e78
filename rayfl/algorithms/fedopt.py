"""FedAdam, FedYogi and FedAdagrad (Reddi et al., 2021, "Adaptive Federated Optimization").

Clients run plain local SGD (as FedAvg). The server treats u = −Δ̄ as an ascent step:
    m ← β1 m + (1 − β1) u
    v ← β2 v + (1 − β2) u²                       (FedAdam)
    v ← v − (1 − β2) u² sign(v − u²)             (FedYogi)
    v ← v + u²                                   (FedAdagrad)
    x ← x + η_g m / (√v + τ)
No bias correction (as in the paper). m starts at 0 and v at v_init (the paper's Algorithm 2
asks v_{-1} ≥ τ²; default τ²). :meth:`FedOpt.reset_moments` zeroes both, as the IMA authors'
code does at t_s (IMA uses it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl import schema
from rayfl.algorithms.base import Aggregate, Algorithm, ServerParams, State, Vec


@dataclass(frozen=True)
class FedOptParams(ServerParams):
    """Adaptive server optimiser hyper-parameters (FedAdagrad has no β2)."""

    server_lr: float = schema.field(0.01, doc="server learning rate η_g", lo=0.0, lo_open=True)
    beta1: float = schema.field(0.9, doc="first-moment decay β1", lo=0.0, hi=1.0, hi_open=True)
    tau: float = schema.field(1e-3, doc="adaptivity τ (added to √v)", lo=0.0, lo_open=True)
    v_init: float | None = schema.field(
        None, doc="initial second moment v_{-1} (null: τ²)", lo=0.0)


@dataclass(frozen=True)
class FedAdamParams(FedOptParams):
    """FedAdam / FedYogi hyper-parameters."""

    beta2: float = schema.field(0.99, doc="second-moment decay β2", lo=0.0, hi=1.0, hi_open=True)


class FedOpt(Algorithm):
    """Shared server rule; subclasses give the v-update. Server state: m, v."""

    Params = FedOptParams

    def _v0(self) -> float:
        return self.p.tau**2 if self.p.v_init is None else self.p.v_init

    def server_init(self, x0: Vec) -> State:
        return self.reset_moments({"x": x0.clone()}, v=self._v0())

    def reset_moments(self, state: State, v: float = 0.0) -> State:
        """The state with m = 0 and v = ``v`` (x untouched)."""
        x = state["x"]
        return {**state, "m": torch.zeros_like(x), "v": torch.full_like(x, v)}

    def _v_update(self, v: Vec, u2: Vec) -> Vec:
        raise NotImplementedError

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        if agg.count == 0:
            return state, {}
        u = -agg.delta_mean  # u = −Δ̄
        m = self.p.beta1 * state["m"] + (1 - self.p.beta1) * u
        v = self._v_update(state["v"], u * u)
        x = state["x"] + self.server_lr * m / (v.sqrt() + self.p.tau)
        return {**state, "x": x, "m": m, "v": v}, {"momentum_norm": float(m.norm()),
                                                   "v_mean": float(v.mean())}


class FedAdam(FedOpt):
    """v ← β2 v + (1 − β2) u²."""

    name = "fedadam"
    Params = FedAdamParams

    def _v_update(self, v: Vec, u2: Vec) -> Vec:
        return self.p.beta2 * v + (1 - self.p.beta2) * u2


class FedYogi(FedOpt):
    """v ← v − (1 − β2) u² sign(v − u²)."""

    name = "fedyogi"
    Params = FedAdamParams

    def _v_update(self, v: Vec, u2: Vec) -> Vec:
        return v - (1 - self.p.beta2) * u2 * torch.sign(v - u2)


class FedAdagrad(FedOpt):
    """v ← v + u²."""

    name = "fedadagrad"
    Params = FedOptParams

    def _v_update(self, v: Vec, u2: Vec) -> Vec:
        return v + u2
