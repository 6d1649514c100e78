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
                                   ServerParams, State, Vec)
from rayfl.algorithms.checks import reject_adam


@dataclass(frozen=True)
class ScaffoldParams(ServerParams):
    """SCAFFOLD hyper-parameters (only the server learning rate η_g)."""


class _ControlRule(LocalRule):
    def __init__(self, correction: Vec):
        self.correction = correction  # c − c_i

    def direction(self, g: Vec, y: Vec, lr: float) -> Vec:
        return g + self.correction  # g(y) − c_i + c


class Scaffold(Algorithm):
    """Client state ``c`` (c_i); server state ``c``; payload ``dc`` = Σ Δc_i."""

    name = "scaffold"
    synchronous_reason = ("its server variate c is updated by the mean Δc_i of one round, every "
                          "c_i⁺ measured from the same x_t and c")
    Params = ScaffoldParams
    client_state = {"c": "model"}
    accepts_server_opt = True

    @classmethod
    def check_config(cls, params, cfg) -> None:
        reject_adam(cls.name, cfg, "option II's c_i = c_i − c + (x_t − y)/(K η_l) assumes the "
                                   "client moved by η_l per SGD direction")

    def server_init(self, x0: Vec) -> State:
        return {**super().server_init(x0), "c": torch.zeros_like(x0)}

    def broadcast(self, state: State, t: int) -> dict[str, Vec]:
        return {"x": state["x"], "c": state["c"]}

    @staticmethod
    def _ci(task: ClientTask) -> Vec:
        return task.state["c"] if task.state is not None else torch.zeros_like(task.bc["x"])

    def client_begin(self, task: ClientTask) -> LocalRule:
        return _ControlRule(task.bc["c"] - self._ci(task))

    def client_end(self, task: ClientTask, y: Vec, steps: int) -> ClientResult:
        bc, c_i = task.bc, self._ci(task)
        if steps == 0:  # nothing trained: no new information about ∇f_i
            return ClientResult({"dc": torch.zeros_like(c_i)}, {"c": c_i})
        c_new = c_i - bc["c"] + (bc["x"] - y) / (self.effective_steps(steps) * task.lr)  # c_i⁺
        return ClientResult({"dc": c_new - c_i}, {"c": c_new})

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        if agg.count == 0:
            return state, {}
        mean_dc = agg.extras["dc"] / agg.count  # mean over the |S_t| clients that returned
        c = state["c"] + (agg.count / self.num_clients) * mean_dc
        new, metrics = self.server_step(state, agg.delta_mean)  # x ← x − η_g Δ̄
        return {**new, "c": c}, {**metrics, "c_norm": float(c.norm())}
