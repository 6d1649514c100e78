"""FedAdam, FedYogi and FedAdagrad (Reddi et al., 2021, "Adaptive Federated Optimization").

Presets: FedAvg with the ``adam``, ``yogi`` or ``adagrad`` server optimizer
(:mod:`rayfl.algorithms.server_opt`). Clients run plain local SGD; the server treats u = −Δ̄ as
an ascent step:
    m ← β1 m + (1 − β1) u
    v ← β2 v + (1 − β2) u²                       (FedAdam)
    v ← v − (1 − β2) u² sign(v − u²)             (FedYogi)
    v ← v + u²                                   (FedAdagrad)
    x ← x + η_g m / (√v + τ)
No bias correction (as in the paper). m starts at 0 and v at v_init (the paper's Algorithm 2
asks v_{-1} ≥ τ²; default τ²). IMA's moment reset zeroes both m and v, as the IMA authors'
code does at t_s.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms import server_opt as opt
from rayfl.algorithms.base import ServerParams
from rayfl.algorithms.fedavg import FedAvg


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


class FedOpt(FedAvg):
    """FedAvg with the adaptive server optimizer named by ``rule``. Server state: m, v."""

    Params = FedOptParams
    rule = ""

    def default_server_opt(self) -> opt.ServerOpt:
        p = self.p
        return opt.build(self.rule, self.server_lr, beta1=p.beta1,
                         beta2=getattr(p, "beta2", 0.0), tau=p.tau, v_init=p.v_init)


class FedAdam(FedOpt):
    """v ← β2 v + (1 − β2) u²."""

    name, rule = "fedadam", "adam"
    Params = FedAdamParams


class FedYogi(FedOpt):
    """v ← v − (1 − β2) u² sign(v − u²)."""

    name, rule = "fedyogi", "yogi"
    Params = FedAdamParams


class FedAdagrad(FedOpt):
    """v ← v + u²."""

    name, rule = "fedadagrad", "adagrad"
