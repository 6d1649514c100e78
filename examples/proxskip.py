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

from rayfl.algorithms.base import Algorithm, ClientResult, LocalRule


class Corrected(LocalRule):
    """The local step direction ∇f_i(x̂) − h_i."""

    def __init__(self, h):
        self.h = h

    def direction(self, g, y, lr):
        return g - self.h


class ProxSkip(Algorithm):
    """Scaffnew: local steps corrected by h_i; h_i updated from the round's average."""

    paper_weighting = "uniform"
    client_state = {"h": "model", "x_hat": "model", "gamma_over_p": "scalar"}

    def client_begin(self, task):
        return Corrected(task.state["h"] if task.state else 0.0)

    def client_end(self, task, y, steps):
        h = task.state["h"] if task.state else y * 0
        scale = task.lr * steps  # γ / p with p = 1/K
        # Δ'_i = x − (x̂_i − (γ/p) h_i) = Δ_i + (γ/p) h_i, weighted like Δ_i
        return ClientResult({"correction": task.weight * scale * h},
                            {"h": h, "x_hat": y, "gamma_over_p": y.new_tensor(scale)})

    def server_update(self, state, agg, t):
        if agg.count == 0:
            return dict(state), {}
        return self.server_step(state, agg.delta_mean + agg.extras["correction"] / agg.weight_sum)

    def round_message(self, state, agg, t):
        return {"x": state["x"]}  # x_{t+1}

    def client_settle(self, state, message):
        h = state["h"] + (message["x"] - state["x_hat"]) / state["gamma_over_p"]
        return {**state, "h": h}
