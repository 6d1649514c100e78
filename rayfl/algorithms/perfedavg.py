"""Per-FedAvg (Fallah, Mokhtari & Ozdaglar, NeurIPS 2020, "Personalized Federated Learning with
Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach").

Clients minimise the MAML objective F_i(w) = f_i(w − α ∇f_i(w)): a model that is good after one
step of local SGD. Each of the round's K local steps draws fresh minibatches D, D' (and D'' for
the Hessian-free variant) from the client's seeded stream:

    w̃ = w − α ∇f_i(w; D)
    FO: w ← w − β ∇f_i(w̃; D')
    HF: w ← w − β (I − α ∇²f_i(w; D'')) ∇f_i(w̃; D'),
        ∇²f_i(w; D'') u ≈ [∇f_i(w + δu; D'') − ∇f_i(w − δu; D'')] / 2δ

β is ``local.lr`` (the step goes through the configured local optimiser); the server is FedAvg.
A client's personalised model is one step of SGD with step α on its own data from the global
model: score it with ``eval.clients`` and ``eval.finetune_steps: 1``, ``eval.finetune_lr: α``.
BatchNorm statistics update once a step (at the ∇f_i(w̃; D') evaluation). α = 0 with FO is
local SGD on every second minibatch. Stateless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, ClientTask, ServerParams, Traits


@dataclass(frozen=True)
class PerFedAvgParams(ServerParams):
    """Per-FedAvg hyper-parameters."""

    alpha: float = schema.field(0.01, doc="α: the step of the one-step personalisation the "
                                          "meta-objective anticipates (local.lr is β)", lo=0.0)
    variant: Literal["fo", "hf"] = schema.field(
        "fo", doc="fo: first-order (drops the Hessian term); hf: Hessian-free (a Hessian-vector "
                  "product by finite differences on a third minibatch)")
    delta: float = schema.field(1e-3, doc="δ of the HF finite difference", lo=0.0, lo_open=True)


class PerFedAvg(Algorithm):
    """FedAvg server; clients take MAML steps (first-order or Hessian-free)."""

    name = "perfedavg"
    Params = PerFedAvgParams
    # the meta-steps are the client's own computation; stateless clients, a step on Δ̄
    traits = Traits(server_opt=True, dp_post_processing=True, asynchronous=None,
                    search_space={"algorithm.alpha": {"low": 1e-3, "high": 0.1, "log": True}})

    def client_train(self, task: ClientTask, ctx):
        y, opt, alpha = ctx.x.clone(), ctx.optimizer(), self.p.alpha
        batches = stream(ctx)
        for _ in range(ctx.num_steps()):
            first, second = next(batches), next(batches)
            adapted = y - alpha * ctx.probe_grad(y, first, record=True)
            g = ctx.loss_grad(adapted, second, record=False)[1].clone()
            if self.p.variant == "hf":
                third, d = next(batches), self.p.delta
                ahead, behind = ctx.probe_grad(y + d * g, third), ctx.probe_grad(y - d * g, third)
                g -= alpha * (ahead - behind) / (2 * d)  # α ∇²f_i(w; D'') g
            opt.step(y, g)
        return ClientResult(y)


def stream(ctx):
    """The client's minibatches, pass after pass (a step draws two or three)."""
    while True:
        yield from ctx.batches()
