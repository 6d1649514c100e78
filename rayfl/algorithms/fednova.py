"""FedNova (Wang et al., 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization").

Clients run plain local SGD; client i's update is normalised by ‖a_i‖₁, the sum of the weights
its K_i local gradients received:
    a_i = K_i                                         (plain SGD)
    a_i = [K_i − ρ (1 − ρ^{K_i}) / (1 − ρ)] / (1 − ρ)   (heavy-ball momentum ρ = local.momentum)
    d_i = Δ_i / a_i;   τ_eff = Σ p_i a_i;   x ← x − η_g τ_eff Σ p_i d_i
Payload: Σ w_i a_i (``wa``) and Σ w_i Δ_i / a_i (``wd``).

Adam is rejected: a_i counts the weights SGD gives its gradients, which Adam's per-coordinate
steps do not follow. Under IMA (the authors' code) the window holds FedNova's updated x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl.algorithms.base import (Aggregate, Algorithm, ClientResult, ClientTask, ServerParams,
                                   State, Vec)
from rayfl.algorithms.checks import reject_adam


@dataclass(frozen=True)
class FedNovaParams(ServerParams):
    """FedNova hyper-parameters (only η_g; ρ is the local optimiser's ``local.momentum``)."""


class FedNova(Algorithm):
    """Normalised averaging; stateless clients and server (beyond x)."""

    name = "fednova"
    synchronous_reason = ("τ_eff = Σ p_i a_i normalises one round's updates, all started from the "
                          "same x_t")
    Params = FedNovaParams

    @classmethod
    def check_config(cls, params, cfg) -> None:
        reject_adam(cls.name, cfg, "the normaliser a_i is the total weight SGD gives the K_i "
                                   "local gradients")

    def client_end(self, task: ClientTask, y: Vec, steps: int) -> ClientResult:
        a, weight = self.effective_steps(steps), task.weight
        delta = task.bc["x"] - y
        d = delta / a if a > 0 else torch.zeros_like(delta)  # d_i = Δ_i / a_i
        return ClientResult({"wa": weight * a, "wd": weight * d}, None)

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        if agg.count == 0:
            return state, {}
        tau_eff = agg.extras["wa"] / agg.weight_sum  # τ_eff = Σ p_i a_i
        d = agg.extras["wd"] / agg.weight_sum  # Σ p_i d_i
        return {**state, "x": state["x"] - self.server_lr * tau_eff * d}, {"tau_eff": tau_eff}
