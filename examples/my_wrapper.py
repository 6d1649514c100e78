"""A server wrapper of your own: deploy an exponential moving average of the server model.

Run it: ``rayfl run configs/test/tiny.yaml "wrappers=[{name: examples.my_wrapper:ServerEMA,
decay: 0.9}]"``. The wrapped algorithm runs unchanged (its clients keep starting from its own
x); the model evaluated and saved is e_t = β e_{t−1} + (1 − β) x_t, e_{−1} = x_0 (Polyak
averaging of the server iterates). It composes with any algorithm and any other wrapper:
``wrappers: [{name: ima}, {name: examples.my_wrapper:ServerEMA}]`` averages IMA's models.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.schema import field


@dataclass(frozen=True)
class ServerEMAParams:
    decay: float = field(0.9, doc="β: the weight of the running average", lo=0.0, hi=1.0,
                         hi_open=True)


class ServerEMA(ServerWrapper):
    """e_t = β e_{t−1} + (1 − β) x_t is deployed; the inner's x is what its clients get."""

    Params = ServerEMAParams
    own_keys = ("ema",)
    inner_model = "ema_inner"  # the inner's own x, kept beside the deployed average

    def server_init(self, x0):
        return {**self.inner.server_init(x0), "ema": x0.clone()}

    def server_update(self, state, agg, t):
        new, metrics = self.inner.server_update(self.strip(state), agg, t)
        beta = self.params.decay
        ema = beta * state["ema"] + (1 - beta) * self.inner.deployed(new)
        return {**new, "ema": ema}, metrics

    def deployed(self, state):
        return state["ema"]

    def extra_models(self, state):
        return {**self.inner.extra_models(self.strip(state)),
                self.inner_model: self.inner.deployed(self.strip(state))}
