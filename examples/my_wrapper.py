"""A server wrapper of your own: deploy an exponential moving average of the server model.

Run it: ``rayfl run configs/test/tiny.yaml "layers=[{name: examples.my_wrapper:ServerEMA,
decay: 0.9}]"``. The wrapped algorithm runs unchanged (its clients keep starting from its own
x); the model evaluated and saved is e_t = β e_{t−1} + (1 − β) x_t, e_{−1} = x_0 (Polyak
averaging of the server iterates). It composes with any algorithm and any other wrapper:
``layers: [{name: ima}, {name: examples.my_wrapper:ServerEMA}]`` averages IMA's models.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.layers import LayerTraits
from rayfl.schema import field


@dataclass(frozen=True)
class ServerEMAParams:
    decay: float = field(0.9, doc="β: the weight of the running average", lo=0.0, hi=1.0,
                         hi_open=True)


class ServerEMA(ServerWrapper):
    """Its slot e_t = β e_{t−1} + (1 − β) x_t is deployed; x is what the clients get."""

    Params = ServerEMAParams
    traits = LayerTraits(inner_model="ema_inner")  # the inner's own model, scored beside e_t

    def init(self, x0):
        return x0.clone()  # e_{−1} = x_0

    def after(self, ema, x, srv):
        beta = self.params.decay  # srv.deployed: the model deployed under this wrapper
        return x, beta * ema + (1 - beta) * srv.deployed, {}

    def deployed(self, ema, x):
        return ema
