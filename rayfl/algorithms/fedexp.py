"""FedExP (Jhunjhunwala, Wang & Joshi, ICLR 2023, "FedExP: Speeding Up Federated Averaging via
Extrapolation"): a server step size from the clients' own updates.

With Δ_i = x^t − y_i and Δ̄ = Σ p_i Δ_i (p_i the normalised aggregation weights, 1/M in the
paper), the server step is
    η_g^t = max{ 1, Σ p_i ‖Δ_i‖² / (2 (‖Δ̄‖² + ε)) },   x^{t+1} = x^t − η_g^t Δ̄,
an extrapolation of FedAvg that POCS theory justifies (the paper's eq. 10, uniform p_i). Each
client sends p_i ‖Δ_i‖² beside its update (so the rule is not post-processing of a noised
mean: refused under ``privacy``). The iterates oscillate, and the paper evaluates the mean of
the last two; the iterate itself is deployed and that mean is scored beside it
(``last_two_test_accuracy``). ε → ∞ is FedAvg (η_g = 1) byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import (Aggregate, Algorithm, ClientResult, ClientTask, ServerRound,
                                   Traits, Vec)


@dataclass(frozen=True)
class FedExPParams:
    """FedExP hyper-parameters (no server learning rate: η_g is computed each round)."""

    eps: float = schema.field(1e-3, doc="ε in the denominator of η_g (the paper's 1e-3 on most "
                              "tasks)", lo=0.0)


@dataclass(frozen=True)
class FedExPState:
    """x^{t−1}, the model before the last update (for the last-two average)."""

    x_prev: Vec


class FedExP(Algorithm):
    """FedAvg clients; the server extrapolates by η_g = max(1, mean‖Δ_i‖² / 2(‖Δ̄‖² + ε))."""

    name = "fedexp"
    Params = FedExPParams
    traits = Traits(capabilities={"extra_models"},
                    search_space={"algorithm.eps": {"low": 1e-4, "high": 1.0, "log": True}})

    def server_init(self, x0: Vec) -> FedExPState:
        return FedExPState(x0.clone())

    def extra_models(self, x: Vec, state: FedExPState) -> dict[str, Vec]:
        """(x^t + x^{t−1}) / 2, the model the paper evaluates."""
        return {"last_two": (x + state.x_prev) / 2}

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        y = ctx.train()
        delta = task.bc["x"] - y
        return ClientResult(y, {"weighted_sq": task.weight * float(delta @ delta)})

    def server_update(self, x: Vec, state: FedExPState, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        mean_sq = agg.extras["weighted_sq"] / agg.weight_sum
        d = agg.delta_mean
        eta = max(1.0, mean_sq / (2 * (float(d @ d) + self.p.eps)))
        return x - eta * d, FedExPState(x), {"server_lr": eta}
