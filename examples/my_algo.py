"""A custom algorithm: FedAvg whose clients are pulled toward the round's global model.

Run it (from the repository root)::

    rayfl run configs/test/tiny.yaml algorithm.name=examples.my_algo:MyAlgo algorithm.pull=0.05
"""

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, LocalRule, ServerParams, Traits


@dataclass(frozen=True)
class PullParams(ServerParams):
    pull: float = schema.field(0.1, doc="strength μ of the pull toward the global model", lo=0.0)


class Pull(LocalRule):
    def __init__(self, x, pull):
        self.x, self.pull = x, pull

    def direction(self, g, y, lr):
        return g + self.pull * (y - self.x)  # ∇f_i(y) + μ (y − x_t)


class MyAlgo(Algorithm):
    """FedAvg plus a proximal pull μ (y − x_t) on every local step (FedProx's local rule)."""

    Params = PullParams
    traits = Traits(search_space={"algorithm.pull": {"low": 1e-3, "high": 1.0, "log": True}})

    def client_train(self, task, ctx):
        return ClientResult(ctx.train(Pull(task.bc["x"], self.p.pull)))
