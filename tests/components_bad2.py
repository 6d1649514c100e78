"""User components whose declarations, or what they return, break their contract (and a few
that keep it in an unusual way), named in configs as ``tests.components_bad2:Name`` by
tests/test_boundary_declarations.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rayfl.algorithms.base import ClientResult, Rows, ServerParams
from rayfl.algorithms.fedavg import FedAvg
from rayfl.algorithms.server_opt import ServerOpt
from rayfl.algorithms.wrapper import ServerWrapper
from tests.components_bad import Linear
from rayfl.data.datasets import Arrays, synthetic
from rayfl.schema import field


# ----- declarations ------------------------------------------------------------------------------
class VectorState(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, client_state={"h": "vector"})


class UnknownCapability(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, capabilities={"teleport"})


class DictTraits(FedAvg):
    traits = {"client_state": {}}


class SettleWithoutMessage(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, capabilities={"settle"})

    def client_settle(self, state, message):
        return state


@dataclass
class Thawed:
    step: int = 0


class ThawedState(FedAvg):
    def server_init(self, x0):
        return Thawed()


@dataclass(frozen=True)
class AscentParams(ServerParams):
    server_lr: float = field(-1.0, doc="redefined with a default the base's bounds refuse")


class ShadowsServerLr(FedAvg):
    Params = AscentParams


@dataclass(frozen=True)
class PullParams(ServerParams):
    pull: float = field(0.1, doc="a new key beside the inherited server_lr", lo=0.0)


class AddsAKey(FedAvg):
    """Extends ServerParams with a key of its own (accepted)."""

    Params = PullParams


class CheckConfigRaises(FedAvg):
    @classmethod
    def check_config(cls, params, cfg, where):
        raise ValueError("clients_per_round must be even")


class NeedsArgument(FedAvg):
    def __init__(self, params, scale, **kw):
        super().__init__(params, **kw)
        self.scale = scale


# ----- what the algorithm hands back -------------------------------------------------------------
class AnyState(FedAvg):
    """Keeps one client-state entry of kind any: ``value()`` (subclasses below)."""

    traits = dataclasses.replace(FedAvg.traits, client_state={"h": "any"})

    def client_train(self, task, ctx):
        return ClientResult(ctx.train(), state={"h": self.value()})


class AnyList(AnyState):
    def value(self):
        return [1.0, 2.0]


class AnyString(AnyState):
    def value(self):
        return "seen"


class AnyLambda(AnyState):
    def value(self):
        return lambda: 1


class AnyArray(AnyState):
    """A numpy array, not the tensor a state file holds."""

    def value(self):
        return np.arange(3.0)


class NumpyExtra(FedAvg):
    def broadcast(self, x, state, t):
        return {"x": x, "c": np.zeros(3)}


class RaggedRows(FedAvg):
    """Each client's row has a length of its own."""

    def client_train(self, task, ctx):
        return ClientResult(ctx.train(), {"r": Rows(torch.zeros(task.client_id % 3 + 1))})


class FloatMessage(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, capabilities={"settle"})

    def round_message(self, x, state, agg, t):
        return 0.5

    def client_settle(self, state, message):
        return state


class ListExtraModels(FedAvg):
    traits = dataclasses.replace(FedAvg.traits, capabilities={"extra_models"})

    def extra_models(self, x, state):
        return [x]


# ----- wrappers ----------------------------------------------------------------------------------
class TensorBroadcast(ServerWrapper):
    def broadcast(self, slot, t):
        return torch.zeros(3)


class DictLayerTraits(ServerWrapper):
    traits = {"needs_updates": False}


class NeedsFacts(ServerWrapper):
    def __init__(self, params, facts, window):
        super().__init__(params, facts)


class StringPayload(ServerWrapper):
    def client_apply(self, delta, t, client, ctx):
        ctx.payload["note"] = "trained"
        return delta


# ----- server optimisers -------------------------------------------------------------------------
def lambda_state(section, lr):
    """SGD whose state holds a function, which no checkpoint can hold."""
    return ServerOpt(lambda x: {"schedule": lambda t: lr}, lambda d, s: (lr * d, s, {}))


# ----- models ------------------------------------------------------------------------------------
class OnMeta(Linear):
    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.to("meta")


class Detached(Linear):
    """Its forward uses its weight detached: no gradient reaches it."""

    def forward(self, x):
        return nn.functional.linear(x, self.layer.weight.detach(), self.layer.bias.detach())


class ComplexWeights(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(num_classes, input_shape[0], dtype=torch.complex64))

    def forward(self, x):
        return (x.to(torch.complex64) @ self.w.T).real


# ----- datasets ----------------------------------------------------------------------------------
class NumpyClasses:
    """The synthetic set with ``num_classes`` a numpy integer (accepted)."""

    @staticmethod
    def load(cfg, seed):
        a = synthetic.load(cfg, seed)
        return dataclasses.replace(a, num_classes=np.int64(a.num_classes))


class ColumnLabels:
    """The synthetic set with labels of shape (n, 1)."""

    @staticmethod
    def load(cfg, seed):
        a = synthetic.load(cfg, seed)
        return Arrays(a.x_train, a.y_train[:, None], a.x_test, a.y_test[:, None],
                      a.input_shape, a.num_classes)


# ----- found by a blind probe ------------------------------------------------------------------
def edits_direction(section, lr):
    """A server optimiser whose step scales the direction it is lent in place."""
    def update(direction, state):
        return direction.mul_(lr), state, {}

    return ServerOpt(lambda x: {}, update)


class EditsInput(Linear):
    """A model whose forward scales its input in place (the test set, at evaluation)."""

    def forward(self, x):
        return self.layer(x.mul_(2.0))
