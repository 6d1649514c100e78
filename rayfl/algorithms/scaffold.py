"""SCAFFOLD, option II (Karimireddy et al., 2020, "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning").

Client i keeps its control variate c_i (init 0); the server keeps c (init 0) and sends (x_t, c).
    local step:  y ← y − η_l (g(y) − c_i + c)
    after K_i:   c_i⁺ = c_i − c + (x_t − y) / (K_i η_l);   reports Δc_i = c_i⁺ − c_i
    server:      x ← x − η_g Δ̄;   c ← c + (|S_t|/N) · mean_{S_t}(Δc_i)
|S_t| counts the clients that actually returned (``agg.count``), so c stays the mean of all N
client variates (absent clients count with their stored c_i).

Local momentum ρ (``local.momentum``): heavy-ball SGD moves y by η_l Σ_j a_j d_j, not η_l Σ_j d_j,
so K_i is replaced by ‖a_i‖₁ = [K_i − ρ (1 − ρ^{K_i}) / (1 − ρ)] / (1 − ρ) (FedNova's normaliser;
K_i at ρ = 0). Dividing by K_i instead would inflate c_i by up to 1/(1 − ρ) every round, and the
corrected local steps, momentum-amplified again, diverge.

Local optimiser: clipping (``local.clip_norm``) acts on ∇f_i only, so c − c_i is never rescaled
and c_i⁺ estimates the mean clipped gradient (+ weight decay) the client really followed. Adam is
rejected: option II reads (x_t − y)/(K_i η_l) as the mean local direction, which only holds for
SGD steps. Under IMA the window averages SCAFFOLD's x; the control variates (gradient estimates,
not models) are not averaged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl.algorithms.base import (Aggregate, Algorithm, ClientResult, ClientTask, LocalRule,
                                   ServerParams, ServerRound, Traits, Vec)


@dataclass(frozen=True)
class ScaffoldParams(ServerParams):
    """SCAFFOLD hyper-parameters (only the server learning rate η_g)."""


class _ControlRule(LocalRule):
    def __init__(self, correction: Vec):
        self.correction = correction  # c − c_i

    def direction(self, g: Vec, y: Vec, lr: float) -> Vec:
        return g + self.correction  # g(y) − c_i + c


@dataclass(frozen=True)
class ScaffoldState:
    """The server's control variate c (the mean of all N clients' c_i)."""

    c: Vec


class Scaffold(Algorithm):
    """Client state ``c`` (c_i); server state c; payload ``dc`` = Σ Δc_i."""

    name = "scaffold"
    Params = ScaffoldParams
    traits = Traits(
        client_state={"c": "model"}, server_opt=True,
        asynchronous="its server variate c is updated by the mean Δc_i of one round, every "
                     "c_i⁺ measured from the same x_t and c",
        adam="option II's c_i = c_i − c + (x_t − y)/(K η_l) assumes the client moved by η_l "
             "per SGD direction")

    def server_init(self, x0: Vec) -> ScaffoldState:
        return ScaffoldState(torch.zeros_like(x0))

    def broadcast(self, x: Vec, state: ScaffoldState, t: int) -> dict[str, Vec]:
        return {"x": x, "c": state.c}

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        bc = task.bc
        c_i = task.state["c"] if task.state is not None else torch.zeros_like(bc["x"])
        y = ctx.train(_ControlRule(bc["c"] - c_i))
        if ctx.steps == 0:  # nothing trained: no new information about ∇f_i
            return ClientResult(y, {"dc": torch.zeros_like(c_i)}, {"c": c_i})
        c_new = c_i - bc["c"] + (bc["x"] - y) / (self.effective_steps(ctx.steps) * task.lr)
        return ClientResult(y, {"dc": c_new - c_i}, {"c": c_new})  # c_i⁺

    def server_update(self, x: Vec, state: ScaffoldState, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        mean_dc = agg.extras["dc"] / agg.count  # mean over the |S_t| clients that returned
        c = state.c + (agg.count / self.num_clients) * mean_dc
        return srv.step(agg.delta_mean), ScaffoldState(c), {"c_norm": float(c.norm())}
