"""FedSAM (Qu et al., ICML 2022, "Generalized Federated Learning via Sharpness Aware
Minimization"): local steps of SAM, server as FedAvg.

Each local step on minibatch b takes two gradients (a client procedure):
    g = ∇f_i(y; b),   ε = ρ g / ‖g‖,   y ← y − η_l ∇f_i(y + ε; b)
(the second gradient through the configured local optimiser: clipping, weight decay, momentum).
The first gradient leaves BatchNorm statistics as they were, so each step updates them once.
ρ = 0 is FedAvg, byte for byte (no perturbation is computed). Stateless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, ClientTask, ServerParams, Traits, Vec

NORM_EPS = 1e-12  # ‖g‖ guard (the SAM authors' code adds 1e-12)


@dataclass(frozen=True)
class FedSAMParams(ServerParams):
    """FedSAM hyper-parameters."""

    rho: float = schema.field(0.05, doc="SAM perturbation radius ρ", lo=0.0)


class FedSAM(Algorithm):
    """FedAvg server; clients take sharpness-aware (SAM) local steps."""

    name = "fedsam"
    Params = FedSAMParams
    # SAM is the client's own computation; stateless clients, a server step on Δ̄
    traits = Traits(server_opt=True, dp_post_processing=True, asynchronous=None,
                    search_space={"algorithm.rho": {"low": 1e-3, "high": 0.5, "log": True}})

    def client_train(self, task: ClientTask, ctx):
        y, opt, rho = ctx.x.clone(), ctx.optimizer(), self.p.rho
        for batch in ctx.batches():
            point = perturbed(ctx, y, batch, rho)[1] if rho else y
            opt.step(y, ctx.loss_grad(point, batch)[1])
        return ClientResult(y)


def perturbed(ctx, y: Vec, batch, rho: float) -> tuple[Vec, Vec]:
    """(g, y + ρ g/‖g‖) with g = ∇f_i(y; b) (a copy), leaving BatchNorm statistics as they
    were: SAM's ascent point, so that each step updates them once (at the second gradient)."""
    g = ctx.probe_grad(y, batch)
    return g, y + g * (rho / (torch.linalg.vector_norm(g) + NORM_EPS))
