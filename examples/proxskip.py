"""ProxSkip / Scaffnew (Mishchenko et al., ICML 2022) in federated rounds, with partial
participation: exact thanks to the round message.

Each client i keeps a control variate h_i (0 at first). In a round from the global model x it
takes K local steps (p = 1/K, γ = η_l of the round)

    x̂_i ← x̂_i − γ (∇f_i(x̂_i) − h_i),

sends x̂_i − (γ/p) h_i, and the server averages: x_{t+1} = mean_i (x̂_i − (γ/p) h_i) (uniform
weights, as in the paper). Then each of the round's clients applies

    h_i ← h_i + (p/γ) (x_{t+1} − x̂_i),

which needs x_{t+1}: the server sends it as the round's message, and the runtime applies the
update when the client next takes part, however many rounds later.

Run it (from the repository root)::

    rayfl run configs/test/tiny.yaml algorithm.name=examples.proxskip:ProxSkip
"""

import torch

from rayfl.algorithms.base import Algorithm, ClientResult, LocalRule, Traits


class Corrected(LocalRule):
    """The local step direction ∇f_i(x̂) − h_i."""

    def __init__(self, h):
        self.h = h

    def direction(self, g, y, lr):
        return g - self.h


class ProxSkip(Algorithm):
    """Scaffnew: local steps corrected by h_i; each client uploads x − (x̂_i − (γ/p) h_i);
    h_i updated from the round's average (the ``settle`` capability)."""

    traits = Traits(weighting="uniform", capabilities={"settle"},
                    client_state={"h": "model", "x_hat": "model", "gamma_over_p": "scalar"})

    def client_train(self, task, ctx):
        x = task.bc["x"]
        h = task.state["h"] if task.state else torch.zeros_like(x)
        y = ctx.train(Corrected(h))
        scale = task.lr * ctx.steps  # γ / p with p = 1/K
        return ClientResult(y, state={"h": h, "x_hat": y, "gamma_over_p": y.new_tensor(scale)},
                            upload=x - (y - scale * h))  # the server averages x̂_i − (γ/p) h_i

    def round_message(self, x, state, agg, t):
        return {"x": x}  # x_{t+1}

    def client_settle(self, state, message):
        h = state["h"] + (message["x"] - state["x_hat"]) / state["gamma_over_p"]
        return {**state, "h": h}
