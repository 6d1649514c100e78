"""FedProx (Li et al., 2020, "Federated Optimization in Heterogeneous Networks").

Client step: the gradient of the proximal objective f_i(y) + (μ/2)‖y − x_t‖²,
    g ← g + μ (y − x_t);
server as FedAvg: x ← x − η_g Δ̄. Stateless.

Any local solver of the proximal objective is the paper's (γ-inexact solutions), so SGD, momentum
and Adam all run on g + μ (y − x_t) (+ wd·y); clipping acts on g only. Under IMA (the authors'
code) the proximal anchor x_t is the IMA mean the client received.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import (Algorithm, ClientResult, ClientTask, LocalRule,
                                   ServerParams, Traits, Vec)


@dataclass(frozen=True)
class FedProxParams(ServerParams):
    """FedProx hyper-parameters."""

    mu: float = schema.field(0.01, doc="proximal coefficient μ", lo=0.0)


class _ProxRule(LocalRule):
    def __init__(self, x_t: Vec, mu: float):
        self.x_t, self.mu = x_t, mu

    def direction(self, g: Vec, y: Vec, lr: float) -> Vec:
        return g + self.mu * (y - self.x_t)  # ∇f_i(y) + μ (y − x_t)


class FedProx(Algorithm):
    """FedAvg server; clients add the proximal gradient μ (y − x_t)."""

    name = "fedprox"
    Params = FedProxParams
    # the proximal term is the client's own computation; FedAsync's local objective is this one
    traits = Traits(server_opt=True, dp_post_processing=True, asynchronous=None,
                    search_space={"algorithm.mu": {"low": 1e-4, "high": 1.0, "log": True}})

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        return ClientResult(ctx.train(_ProxRule(task.bc["x"], self.p.mu)))
