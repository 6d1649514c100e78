"""q-FedAvg (Li, Sanjabi, Beirami & Smith, ICLR 2020, "Fair Resource Allocation in Federated
Learning"): minimises the q-FFL objective Σ_k p_k F_k^{q+1}(w) / (q + 1), which weights the
clients with high loss more (fairer accuracy across clients; q = 0 is FedAvg's objective).

Client k in round t runs the configured local training from w^t to w̄_k^{t+1} and computes, with
L = 1/η_l (the authors' estimate of the Lipschitz constant) and F_k(w^t) its mean loss at w^t
over all its training rows (Algorithm 2 of the paper):
    Δw_k = L (w^t − w̄_k^{t+1}),   Δ_k = F_k^q(w^t) Δw_k,
    h_k = q F_k^{q−1}(w^t) ‖Δw_k‖² + L F_k^q(w^t);
the server steps
    w^{t+1} = w^t − Σ_{k∈S_t} p_k Δ_k / Σ_{k∈S_t} p_k h_k
(p_k = 1 under the paper's uniform weighting, the default here). Losses must be non-negative
(cross-entropy is). q = 0 is uniform FedAvg up to rounding: Σ (w^t − w̄_k)/η / (|S_t|/η).
The loss at w^t is a training forward with BatchNorm statistics restored afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfl import schema
from rayfl.algorithms.base import (Aggregate, Algorithm, ClientResult, ClientTask, ServerRound,
                                   Traits, Vec)


@dataclass(frozen=True)
class QFedAvgParams:
    """q-FedAvg hyper-parameters (the paper tunes q per dataset over 0.001–15)."""

    q: float = schema.field(1.0, doc="fairness exponent q (0: FedAvg's objective)", lo=0.0)


class QFedAvg(Algorithm):
    """Clients send F^q-scaled updates and a step-size estimate h_k; the server divides."""

    name = "qfedavg"
    Params = QFedAvgParams
    traits = Traits(weighting="uniform",
                    search_space={"algorithm.q": {"low": 1e-3, "high": 15.0, "log": True}})

    def client_train(self, task: ClientTask, ctx):
        q, lipschitz = self.p.q, 1.0 / task.lr
        loss0 = start_loss(ctx)
        y, opt = ctx.x.clone(), ctx.optimizer()
        for batch in ctx.batches():
            opt.step(y, ctx.loss_grad(y, batch)[1])
        dw = lipschitz * (ctx.x - y)
        fq = loss0**q
        h = (q * loss0 ** (q - 1) * float(dw @ dw) if q else 0.0) + lipschitz * fq
        return ClientResult(y, {"delta": task.weight * fq * dw, "h": task.weight * h})

    def server_update(self, x: Vec, state, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        return x - agg.extras["delta"] / agg.extras["h"], state, {}


def start_loss(ctx) -> float:
    """F_k(w^t): the mean loss at the round's start over all the client's rows (in chunks of
    the local batch size; not counted in the training loss; buffers as they were)."""
    saved, total = ctx.get_buffers(), 0.0
    for lo in range(0, ctx.n, ctx.spec.batch_size):
        rows = np.arange(lo, min(lo + ctx.spec.batch_size, ctx.n))
        total += float(ctx.loss_grad(ctx.x, rows, record=False)[0]) * len(rows)
    ctx.set_buffers(saved)
    return total / ctx.n
