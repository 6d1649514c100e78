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
                                   ServerRound, Traits, Vec)


@dataclass(frozen=True)
class FedNovaParams(ServerParams):
    """FedNova hyper-parameters (only η_g; ρ is the local optimiser's ``local.momentum``)."""


class FedNova(Algorithm):
    """Normalised averaging; stateless clients and server (beyond x)."""

    name = "fednova"
    Params = FedNovaParams
    traits = Traits(
        asynchronous="τ_eff = Σ p_i a_i normalises one round's updates, all started from the "
                     "same x_t",
        adam="the normaliser a_i is the total weight SGD gives the K_i local gradients")

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        y = ctx.train()
        a, weight = self.effective_steps(ctx.steps), task.weight
        delta = task.bc["x"] - y
        d = delta / a if a > 0 else torch.zeros_like(delta)  # d_i = Δ_i / a_i
        return ClientResult(y, {"wa": weight * a, "wd": weight * d})

    def server_update(self, x: Vec, state, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        tau_eff = agg.extras["wa"] / agg.weight_sum  # τ_eff = Σ p_i a_i
        d = agg.extras["wd"] / agg.weight_sum  # Σ p_i d_i
        return x - self.server_lr * tau_eff * d, state, {"tau_eff": tau_eff}
