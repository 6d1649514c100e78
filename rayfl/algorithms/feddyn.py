"""FedDyn (Acar et al., 2021, "Federated Learning Based on Dynamic Regularization").

Client i keeps ĝ_i (init 0, its estimate of ∇f_i at the optimum); the server keeps h (init 0).
    local step:  y ← y − η_l (g(y) − ĝ_i + α (y − x_t))
    after:       ĝ_i ← ĝ_i − α (y − x_t)
    server:      h ← h − α (1/N) Σ_{i∈S_t} (y_i − x_t)      (= h + (α/N) Σ Δ_i)
                 x ← mean_{S_t}(y_i) − h/α                    (= x_t − (Δ̄ + h/α))
η_g scales the whole server step, x ← x_t − η_g (Δ̄ + h/α); the paper's rule is η_g = 1.
The mean follows ``aggregation.weighting`` (the paper: uniform).

Local optimiser: the paper lets clients solve their local problem with any solver, so SGD (with
momentum) and Adam both run on its gradient g − ĝ_i + α (y − x_t) (+ wd·y). Clipping acts on g
only; the FedDyn reference code instead clips the whole corrected gradient (``clip_grad_norm_``
at 10 after adding the linear and proximal terms to the loss), which rescales −ĝ_i and the pull
toward x_t whenever it binds. Under IMA the window averages FedDyn's x (= x̄ − h/α); h and ĝ_i
are not averaged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl import schema
from rayfl.algorithms.base import (Aggregate, Algorithm, ClientResult, ClientTask, LocalRule,
                                   ServerParams, ServerRound, Traits, Vec)


@dataclass(frozen=True)
class FedDynParams(ServerParams):
    """FedDyn hyper-parameters."""

    alpha: float = schema.field(0.01, doc="dynamic regularisation coefficient α", lo=0.0,
                                lo_open=True)


class _DynRule(LocalRule):
    def __init__(self, x_t: Vec, g_hat: Vec, alpha: float):
        self.x_t, self.g_hat, self.alpha = x_t, g_hat, alpha

    def direction(self, g: Vec, y: Vec, lr: float) -> Vec:
        return g - self.g_hat + self.alpha * (y - self.x_t)  # g(y) − ĝ_i + α (y − x_t)


@dataclass(frozen=True)
class FedDynState:
    """The server's h (the running mean of the clients' drift, scaled by α)."""

    h: Vec


class FedDyn(Algorithm):
    """Client state ``g_hat`` (ĝ_i); server state h."""

    name = "feddyn"
    Params = FedDynParams
    traits = Traits(
        client_state={"g_hat": "model"}, server_opt=True,
        asynchronous="its server h and each client's ĝ_i follow the drift y_i − x_t of "
                     "synchronous rounds: h sums one round's clients against the same x_t",
        search_space={"algorithm.alpha": {"low": 1e-4, "high": 1.0, "log": True}})

    @property
    def reg(self) -> float:
        """The coefficient α of the linear-plus-proximal local term (FedSpeed's 1/λ)."""
        return self.p.alpha

    def server_init(self, x0: Vec) -> FedDynState:
        return FedDynState(torch.zeros_like(x0))

    @staticmethod
    def _g_hat(task: ClientTask) -> Vec:
        return task.state["g_hat"] if task.state is not None else torch.zeros_like(task.bc["x"])

    def rule(self, task: ClientTask) -> LocalRule:
        """The round's corrected local step: g(y) − ĝ_i + α (y − x_t)."""
        return _DynRule(task.bc["x"], self._g_hat(task), self.reg)

    def result(self, task: ClientTask, y: Vec) -> ClientResult:
        """ĝ_i ← ĝ_i − α (y − x_t) after the local steps ended at ``y``."""
        g_hat = self._g_hat(task) - self.reg * (y - task.bc["x"])
        return ClientResult(y, {}, {"g_hat": g_hat})

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        return self.result(task, ctx.train(self.rule(task)))

    def server_update(self, x: Vec, state: FedDynState, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        alpha = self.reg
        h = state.h + (alpha / self.num_clients) * agg.delta_sum
        return srv.step(agg.delta_mean + h / alpha), FedDynState(h), {"h_norm": float(h.norm())}
