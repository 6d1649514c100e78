"""MOON, model-contrastive federated learning (Li, He & Song, CVPR 2021), as a client procedure.

Each local step on minibatch (x, y) minimises (paper eq. 3–4)

    ℓ = ℓ_sup(w; x, y) + μ ℓ_con,
    ℓ_con = −log [ exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ],

with z, z_glob, z_prev the representations of x under the local model w, the round's global
model w^t and the client's previous local model w_i^{t−1} (the global model on its first
round), sim the cosine similarity. Here the representation is the classifier head's input
(``repr``); the paper's projection head is ``model.projection``. The previous local model is
the client's persistent state; the server is FedAvg's. μ = 0 is FedAvg byte for byte.

A representation after a ReLU can be all zero for some rows, where the cosine similarity's
gradient is 1/ε = 1e8 (torch's ε, as in the authors' code); the projection head's output has no
ReLU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, ClientTask, ServerParams, Traits


@dataclass(frozen=True)
class MOONParams(ServerParams):
    """MOON hyper-parameters (the paper's defaults: τ = 0.5; μ = 1, 5 on CIFAR-10)."""

    mu: float = schema.field(1.0, doc="weight μ of the model-contrastive loss", lo=0.0)
    tau: float = schema.field(0.5, doc="temperature τ of the contrastive loss", lo=0.0,
                              lo_open=True)


class MOON(Algorithm):
    """FedAvg whose local loss adds MOON's model-contrastive term."""

    name = "moon"
    Params = MOONParams
    traits = Traits(client_state={"prev": "model"}, server_opt=True,
                    dp_post_processing=True,  # the contrastive term and w_i^{t−1} stay local
                    search_space={"algorithm.mu": {"low": 1e-2, "high": 10.0, "log": True}})

    def client_train(self, task: ClientTask, ctx):
        w_glob = ctx.x
        w_prev = task.state["prev"] if task.state else w_glob
        y, opt = w_glob.clone(), ctx.optimizer()
        for batch in ctx.batches():
            logits, feats, labels = ctx.outputs(y, batch, ("repr",))
            loss = ctx.loss(logits, labels)
            if self.p.mu:
                z = feats["repr"].flatten(1)
                z_glob = ctx.features(w_glob, batch, ("repr",))[1]["repr"].flatten(1)
                z_prev = ctx.features(w_prev, batch, ("repr",))[1]["repr"].flatten(1)
                sims = torch.stack([F.cosine_similarity(z, z_glob), F.cosine_similarity(z, z_prev)],
                                   dim=1) / self.p.tau
                positive = torch.zeros(len(z), dtype=torch.long, device=z.device)
                loss = loss + self.p.mu * F.cross_entropy(sims, positive)
            opt.step(y, ctx.backward(loss))
        return ClientResult(y, {}, {"prev": y.clone()})
