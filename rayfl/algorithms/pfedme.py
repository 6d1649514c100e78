"""pFedMe, "Personalized Federated Learning with Moreau Envelopes" (T. Dinh, Tran & Nguyen,
NeurIPS 2020), Algorithm 1 as in the authors' code, as a client procedure.

The server broadcasts w^t; a selected client i sets its local model w = w^t and its personal
model θ = w^t (both re-set from the server model every round, as the authors' code does), then
for each local minibatch D (the paper's R local rounds) approximately solves the Moreau
envelope's inner problem min_θ f_i(θ; D) + λ/2 ‖θ − w‖² with K steps on the same minibatch and
moves w toward the result:

    K times:  θ ← θ − p_lr (∇f_i(θ; D) + λ (θ − w))
    w ← w − η λ (w − θ)                               (η: the local learning rate η_l)

The client uploads w (Δ_i = w^t − w) and keeps θ. The server's
w^{t+1} = (1 − β) w^t + β Σ n_i w_i / Σ n_i is FedAvg's step x ← x − β Δ̄, with β the
``algorithm.server_lr`` (the paper's default 1; it also uses 2).

With θ the exact inner minimiser θ*(w) (K large), the w step η λ (w − θ*) = η ∇F_i(w) is a
gradient step on the Moreau envelope F_i(w) = min_θ f_i(θ; D) + λ/2 ‖θ − w‖². As λ → ∞, θ* → w
and that step is local SGD on f_i: FedAvg, with θ = w. As λ → 0, w stays at w^t and θ is K·R
steps of local SGD (step p_lr) from w^t: local training, with a global model that never moves.

θ (with the BatchNorm statistics of its forward passes) is the client's personal model, the one
``eval.clients`` scores as its ``personal_*`` accuracy; the global model before its first round.
The updates are the paper's plain steps: other ``local.*`` optimiser settings (momentum, weight
decay, clipping, Adam) are refused; ``rayfl compare`` runs it at momentum 0 with the same
effective step, lr / (1 − momentum).
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, ClientTask, ServerParams, Traits, Vec


@dataclass(frozen=True)
class PFedMeParams(ServerParams):
    """pFedMe hyper-parameters (the paper's defaults: λ = 15, K = 5; β is ``server_lr``)."""

    lam: float = schema.field(15.0, doc="λ: pull of the personal model θ toward the local one",
                              lo=0.0, lo_open=True)
    personal_lr: float = schema.field(0.01, doc="p_lr: the personal learning rate (inner step)",
                                      lo=0.0, lo_open=True)
    inner_steps: int = schema.field(5, doc="K: inner steps on θ per minibatch", lo=1, hi=1000)


class PFedMe(Algorithm):
    """Local steps on the Moreau envelope; the inner solution θ is the personal model."""

    name = "pfedme"
    Params = PFedMeParams
    # its own β step, no server optimiser; the server reads only Δ̄: θ never leaves the client
    traits = Traits(
        client_state={"theta": "model", "theta_buffers": "buffers"}, dp_post_processing=True,
        capabilities={"personal_model"},
        plain_sgd="its steps on θ and w are the paper's plain ones",
        compare_plain=("momentum", "weight_decay", "clip_norm"),
        search_space={"algorithm.lam": {"low": 1.0, "high": 30.0, "log": True},
                      "algorithm.personal_lr": {"low": 1e-3, "high": 0.1, "log": True}})

    def client_train(self, task: ClientTask, ctx):
        lam, p_lr, k = self.p.lam, self.p.personal_lr, self.p.inner_steps
        w, theta = ctx.x.clone(), ctx.x.clone()
        for batch in ctx.batches():
            for j in range(k):  # the same minibatch; one recorded loss per minibatch
                g = ctx.loss_grad(theta, batch, record=j == k - 1)[1]
                theta.add_(g + lam * (theta - w), alpha=-p_lr)
            w.add_(w - theta, alpha=-ctx.lr * lam)
        return ClientResult(w, {}, {"theta": theta, "theta_buffers": ctx.get_buffers()})

    def personal_model(self, state: dict | None, x: Vec, group=None, buffers=None):
        """θ with its statistics (the global model before the client's first round)."""
        if state is None:
            return x, None
        buffers = state.get("theta_buffers")
        return state["theta"], buffers if buffers is not None and buffers.numel() else None
