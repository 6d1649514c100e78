"""AdaBest (Varno et al., 2022, "AdaBest: Minimizing Client Drift in Federated Learning via
Adaptive Bias Estimation").

Client i keeps h_i (init 0) and t_i', the last round it trained (init −1; a 1-element tensor).
    local step:  y ← y − η_l (g(y) − μ h_i)
    after round t:  h_i ← h_i / (t − t_i') + (x_t − y_i);   t_i' ← t
Server keeps x̄_prev (init x_0):
    x̄ = mean_{S_t}(y_i);   h = β (x̄_prev − x̄);   x_{t+1} = x̄ − h;   x̄_prev ← x̄
The deployed model is x̄ (the paper keeps it "for deployment"); x_{t+1} is reported as "next".
With η_g = 1 (the paper) the server rule is Nesterov SGD (lr 1, momentum β) on x_t − x̄; other η_g
scale the whole step: x_{t+1} = x_t + η_g (x̄ − h − x_t).

Rejected combinations: Adam (h_i accumulates the SGD displacement x_t − y_i that the correction
−μ h_i is scaled for; the paper trains with SGD only) and IMA (the deployed model is x̄, but IMA
would average x_{t+1} = x̄ − h, and h is computed from x̄_prev, not from anything IMA keeps).
Clipping acts on ∇f_i only, never on μ h_i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl import schema
from rayfl.algorithms.base import (Aggregate, Algorithm, ClientResult, ClientTask, LocalRule,
                                   ServerParams, ServerRound, Traits, Vec)


@dataclass(frozen=True)
class AdaBestParams(ServerParams):
    """AdaBest hyper-parameters."""

    mu: float = schema.field(0.02, doc="regularisation factor μ on the client bias h_i", lo=0.0)
    beta: float = schema.field(0.96, doc="server decay β of h (0.98 suits full participation)",
                               lo=0.0, hi=1.0)


class _BiasRule(LocalRule):
    def __init__(self, correction: Vec):
        self.correction = correction  # μ h_i

    def direction(self, g: Vec, y: Vec, lr: float) -> Vec:
        return g - self.correction  # g(y) − μ h_i


@dataclass(frozen=True)
class AdaBestState:
    """The server's x̄ (the last round's client mean: deployed) and h = β (x̄_prev − x̄)."""

    x_bar: Vec
    h: Vec


class AdaBest(Algorithm):
    """Client state ``h`` (h_i) and ``t_last`` (t_i'); server state x̄ and h."""

    name = "adabest"
    Params = AdaBestParams
    traits = Traits(
        weighting="uniform",  # x̄ is the plain mean of the participants' models
        dp_post_processing=True,  # x̄ = x − Δ̄; h_i never leaves the client
        client_state={"h": "model", "t_last": "scalar"},
        capabilities={"extra_models"},
        asynchronous="h_i decays by the rounds since the client last trained, and the server's "
                     "h differences consecutive round means x̄",
        averaging="it deploys x̄, the plain client mean, while IMA would average its next start "
                  "x̄ − h",
        adam="h_i accumulates the SGD displacement x_t − y_i that its correction −μ h_i is "
             "scaled for",
        search_space={"algorithm.beta": {"low": 0.7, "high": 0.999},
                      "algorithm.mu": {"low": 1e-3, "high": 0.3, "log": True}})

    def server_init(self, x0: Vec) -> AdaBestState:
        return AdaBestState(x0.clone(), torch.zeros_like(x0))

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        cstate, t = task.state, task.t
        correction = torch.zeros_like(task.bc["x"]) if cstate is None else \
            self.p.mu * cstate["h"]
        y = ctx.train(_BiasRule(correction))
        g_i = task.bc["x"] - y  # g_i = x_t − y_i
        if cstate is None:  # h_i = 0, t_i' = −1: the first term vanishes
            h = g_i
        else:
            gap = max(t - int(cstate["t_last"].item()), 1)  # t − t_i'
            h = cstate["h"] / gap + g_i
        t_last = torch.tensor([t], dtype=y.dtype, device=y.device)
        return ClientResult(y, {}, {"h": h, "t_last": t_last})

    def server_update(self, x: Vec, state: AdaBestState, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        x_bar = x - agg.delta_mean  # x̄ = mean(y_i)
        h = self.p.beta * (state.x_bar - x_bar)  # h = β (x̄_prev − x̄)
        new = x + self.server_lr * (x_bar - h - x)  # η_g = 1: x̄ − h
        return new, AdaBestState(x_bar, h), {"h_norm": float(h.norm())}

    def deployed(self, x: Vec, state: AdaBestState) -> Vec:
        return state.x_bar

    def extra_models(self, x: Vec, state: AdaBestState) -> dict[str, Vec]:
        return {"next": x}
