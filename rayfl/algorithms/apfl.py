"""APFL, adaptive personalised federated learning (Deng, Kamani & Mahdavi, 2020, "Adaptive
Personalized Federated Learning"), as a client procedure.

Each selected client i trains the global model w from w^t with the local optimiser, as FedAvg
does, and beside it its personal model v_i and mixing weight α_i (Algorithm 1): on each local
minibatch ξ, with v̄ = α_i v_i + (1 − α_i) w the mixed model before the step,

    w   ← w − η ∇f_i(w; ξ),
    v_i ← v_i − η α_i ∇f_i(v̄; ξ),
    α_i ← clip_[0,1](α_i − η_α ⟨v_i − w, ∇f_i(v̄; ξ)⟩)     (adaptive only; v_i, w before the step).

w is uploaded (the server averages it, so the global model's bytes are FedAvg's whatever α);
v_i and α_i are the client's persistent state (w^t and the configured α on its first round).
The client's personal model, scored by ``eval.clients``, is α_i v_i + (1 − α_i) x with x the
current global model. α = 0 is FedAvg (v_i never moves); α = 1 without adaptation trains v_i
alone, locally. v_i keeps no BatchNorm statistics of its own: the v̄ gradient leaves the
buffers as w's training left them, and the personal model is scored with the global ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, ClientTask, ServerParams, Traits, Vec


@dataclass(frozen=True)
class APFLParams(ServerParams):
    """APFL hyper-parameters (the paper's experiments use α ∈ {0.25, 0.5, 0.75})."""

    alpha: float = schema.field(0.25, doc="α: initial weight of the personal model in the mix",
                                lo=0.0, hi=1.0)
    adaptive: bool = schema.field(False, doc="update each client's α by its gradient every step")
    alpha_lr: Optional[float] = schema.field(None, doc="η_α: step size of α's update (None: η, "
                                             "the local learning rate)", lo=0.0, lo_open=True)


class APFL(Algorithm):
    """FedAvg for the global model; a personal model mixed with it by a per-client α."""

    name = "apfl"
    Params = APFLParams
    # the uploaded w is FedAvg's local SGD; v_i never leaves the client
    traits = Traits(client_state={"v": "model", "alpha": "scalar"}, server_opt=True,
                    dp_post_processing=True, capabilities={"personal_model"},
                    search_space={"algorithm.alpha": {"low": 0.0, "high": 1.0}})

    def client_train(self, task: ClientTask, ctx):
        w, opt = ctx.x.clone(), ctx.optimizer()
        if task.state:
            v, a = task.state["v"].to(w, copy=True), task.state["alpha"].to(w, copy=True)
        else:
            v, a = w.clone(), torch.full((1,), self.p.alpha, dtype=w.dtype, device=w.device)
        alpha_lr = ctx.lr if self.p.alpha_lr is None else self.p.alpha_lr
        for batch in ctx.batches():
            mixed, gap = a * v + (1 - a) * w, (v - w if self.p.adaptive else None)
            opt.step(w, ctx.loss_grad(w, batch)[1])
            g = ctx.probe_grad(mixed, batch)  # the uploaded statistics stay those of w's
            v.sub_(ctx.lr * a * g)
            if self.p.adaptive:
                a = (a - alpha_lr * torch.dot(gap, g)).clamp_(0.0, 1.0)
        return ClientResult(w, {}, {"v": v, "alpha": a})

    def personal_model(self, state: dict | None, x: Vec, group=None, buffers=None):
        """α_i v_i + (1 − α_i) x (the global model before the client's first round)."""
        if state is None:
            return x, None
        a = state["alpha"].to(x)
        return a * state["v"].to(x) + (1 - a) * x, None
