"""Small user components that break their contract (and a few that keep it in an unusual way),
named in configs as ``tests.components_bad:Name`` by tests/test_boundary_runtime.py."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rayfl.algorithms.base import ClientResult
from rayfl.algorithms.fedavg import FedAvg
from rayfl.algorithms.scaffold import Scaffold
from rayfl.algorithms.server_opt import ServerOpt
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.availability import AvailabilityModel
from rayfl.schema import field
from rayfl.selection import Selector


# ----- model builders -------------------------------------------------------------------------
def string_model(input_shape, num_classes):
    return "a model"


def none_model(input_shape, num_classes):
    return None


def number_model(input_shape, num_classes):
    return 3


class Linear(nn.Module):
    """A linear model (the base of the broken ones below)."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.layer = nn.Linear(input_shape[0], num_classes)

    def forward(self, x):
        return self.layer(x)


class NoParameters(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.classes = num_classes

    def forward(self, x):
        return torch.zeros(len(x), self.classes)


class FrozenOnly(Linear):
    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.layer.requires_grad_(False)


class TupleOut(Linear):
    def forward(self, x):
        return self.layer(x), x


class DictOut(Linear):
    def forward(self, x):
        return {"logits": self.layer(x)}


class TwiceTheClasses(Linear):
    def forward(self, x):
        return torch.cat([self.layer(x)] * 2, 1)


class IntScores(Linear):
    def forward(self, x):
        return self.layer(x).long()


class NanOnRealData(Linear):
    """Finite on the zeros batch, NaN on any real row."""

    def forward(self, x):
        out = self.layer(x)
        return out * float("nan") if bool(x.abs().sum() > 0) else out


class RaisesKeyError(Linear):
    def forward(self, x):
        return {}["logits"]


# ----- selectors ------------------------------------------------------------------------------
class ReturnsIds(Selector):
    """Returns what ``ids(online, m)`` gives (subclasses below)."""

    def select(self, t, rng, online, m, losses):
        return self.ids(online, m)


class OutOfRange(ReturnsIds):
    def ids(self, online, m):
        return np.arange(m) + 10_000


class Negative(ReturnsIds):
    def ids(self, online, m):
        return -np.arange(1, m + 1)


class FloatIds(ReturnsIds):
    def ids(self, online, m):
        return online[:m].astype(np.float64) + 0.5


class FloatList(ReturnsIds):
    def ids(self, online, m):
        return [float(i) for i in online[:m]]


class Repeats(ReturnsIds):
    def ids(self, online, m):
        return np.repeat(online[:1], m)


class TooMany(ReturnsIds):
    def ids(self, online, m):
        return online[:m + 1]


class TooFew(ReturnsIds):
    def ids(self, online, m):
        return online[:m - 1]


class NoneWhileOnline(ReturnsIds):
    def ids(self, online, m):
        return online[:0]


class ReturnsNone(ReturnsIds):
    def ids(self, online, m):
        return None


class ReturnsSet(ReturnsIds):
    def ids(self, online, m):
        return set(online[:m].tolist())


class TwoDimensional(ReturnsIds):
    def ids(self, online, m):
        return online[:m].reshape(1, -1)


class BoolMask(ReturnsIds):
    def ids(self, online, m):
        return np.isin(np.arange(online.max() + 1), online[:m])


class IntList(ReturnsIds):
    """Keeps the contract with a plain list of ints (accepted)."""

    def ids(self, online, m):
        return [int(i) for i in online[:m]]


class PicksOffline(ReturnsIds):
    """Every id but the online ones first (used with EvenOnly: the odd ids are offline)."""

    def ids(self, online, m):
        return np.setdiff1d(np.arange(20), online)[:m]


class RaisesInSelect(Selector):
    def select(self, t, rng, online, m, losses):
        return {}["clients"]


class FailsInRoundThree(Selector):
    """Uniform until round 3 (t = 2), then a duplicate id."""

    def select(self, t, rng, online, m, losses):
        picked = rng.choice(online, m, replace=False)
        return picked if t < 2 else np.repeat(picked[:1], m)


class RaisesInRoundThree(Selector):
    """Uniform until round 3 (t = 2), then an exception of its own."""

    def select(self, t, rng, online, m, losses):
        if t == 2:
            raise RuntimeError("the selector's own bug")
        return rng.choice(online, m, replace=False)


class UnencodableState(Selector):
    def state(self):
        return {"seen": {1, 2, 3}}


class UnencodableAfterObserve(Selector):
    """A state a checkpoint can hold until the first round is observed."""

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.memory = {}

    def observe(self, t, losses):
        self.memory = {int(c): object() for c in losses}

    def state(self):
        return {str(k): v for k, v in self.memory.items()}


class BrokenInit(Selector):
    def __init__(self, params, ctx):
        raise AttributeError("no such setting")


@dataclass(frozen=True)
class FractionParams:
    fraction: float = field(5.0, doc="a default outside its own bounds", lo=0.0, hi=1.0)


class DefaultOutOfBounds(Selector):
    Params = FractionParams


# ----- availability models --------------------------------------------------------------------
class Mask(AvailabilityModel):
    """Returns what ``mask(n)`` gives for N clients (subclasses below)."""

    def online(self, t, now):
        return self.mask(self.ctx.num_clients)


class ShortMask(Mask):
    def mask(self, n):
        return np.ones(n - 1, bool)


class IdsInsteadOfMask(Mask):
    def mask(self, n):
        return np.arange(0, n, 2)


class ZeroOneInts(Mask):
    def mask(self, n):
        return np.ones(n, dtype=np.int64)


class StringMask(Mask):
    def mask(self, n):
        return "all"


class RaisesInOnline(Mask):
    def mask(self, n):
        return 1 / 0


class EvenOnly(Mask):
    """Keeps the contract with a list of booleans (accepted): the even ids are online."""

    def mask(self, n):
        return [i % 2 == 0 for i in range(n)]


class NobodyOnline(Mask):
    def mask(self, n):
        return np.zeros(n, bool)


class OfflineInRoundsOneAndThree(AvailabilityModel):
    """Everyone online, except nobody in rounds 1 and 3 (t = 0, 2)."""

    def online(self, t, now):
        return np.full(self.ctx.num_clients, t not in (0, 2))


class ShortReportMask(AvailabilityModel):
    def online_at(self, clients, times):
        return np.ones(len(clients) + 1, bool)


# ----- algorithms -----------------------------------------------------------------------------
class ClientRaises(FedAvg):
    """A client that fails in its local training."""

    def client_train(self, task, ctx):
        raise ValueError("the client's rule is broken")


class BroadcastWithoutX(FedAvg):
    def broadcast(self, x, state, t):
        return {"y": x}


class NegativeWeights(FedAvg):
    def aggregation_weights(self, state, client_ids, num_samples):
        return -np.ones(len(client_ids))


class NanWeights(FedAvg):
    def aggregation_weights(self, state, client_ids, num_samples):
        return np.full(len(client_ids), np.nan)


class ListState(FedAvg):
    def server_init(self, x0):
        return [x0.clone()]


class ShrinksX(FedAvg):
    def server_update(self, x, state, agg, srv):
        x, state, metrics = super().server_update(x, state, agg, srv)
        return x[:-1], state, metrics


class RaisesInRoundTwo(FedAvg):
    def server_update(self, x, state, agg, srv):
        if srv.t == 1:
            raise RuntimeError("the server rule is broken")
        return super().server_update(x, state, agg, srv)


class StringMetric(FedAvg):
    def server_update(self, x, state, agg, srv):
        x, state, metrics = super().server_update(x, state, agg, srv)
        return x, state, {**metrics, "note": "hello"}


class DeploysPart(FedAvg):
    def deployed(self, x, state):
        return x[:5]


class NotAnAlgorithm:
    """No Algorithm base class."""


class NotASelector:
    def select(self, t, rng, online, m, losses):
        return online[:m]


class PlainParams:
    pull: float = 0.1


class UndecoratedParams(FedAvg):
    Params = PlainParams


@dataclass(frozen=True)
class SetParams:
    tags: set = field(frozenset({1}), doc="a set the schema cannot validate")


class SetParamsAlgorithm(FedAvg):
    Params = SetParams


# ----- models and wrappers ----------------------------------------------------------------------
class RaisesWhileBuilding(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        raise RuntimeError("no accelerator on this laptop")


class UploadsNone(ServerWrapper):
    def client_apply(self, delta, t, client, ctx):
        return None


class NegativeRate(ServerWrapper):
    def client_lr(self, slot, t, inner):
        return -inner(t)


class AfterReturnsTwo(ServerWrapper):
    def after(self, slot, x, srv):
        return x, slot


def short_step(section, lr):
    """A server optimiser whose step misses a coordinate."""
    return ServerOpt(lambda x: {}, lambda d, s: (lr * d[:-1], s, {}))


# ----- algorithms and models that edit what rayfl lends them -------------------------------------
class EditsState(Scaffold):
    """Nudges its stored control variate in place before training on it."""

    def client_train(self, task, ctx):
        if task.state is not None:
            task.state["c"].add_(0.01)
        return super().client_train(task, ctx)


class SortsItsMinibatches(FedAvg):
    """Sorts each minibatch's index array in place before its step (from round 2 on: the
    pre-flight trains round 1); on a GPU the rows would still come in the upload's order."""

    def client_train(self, task, ctx):
        y, opt = ctx.x.clone(), ctx.optimizer()
        for batch in ctx.batches():
            if task.t >= 1:
                batch.sort()
            opt.step(y, ctx.loss_grad(y, batch)[1])
        return ClientResult(y)


class EditsAMinibatchAndPutsItBack(FedAvg):
    """Points each minibatch at its first row for its step, then restores it (from round 2 on):
    on the CPU the step trains the edited rows, on a GPU the upload's."""

    def client_train(self, task, ctx):
        y, opt = ctx.x.clone(), ctx.optimizer()
        for batch in ctx.batches():
            saved = batch.copy()
            if task.t >= 1:
                batch[:] = batch[0]
            opt.step(y, ctx.loss_grad(y, batch)[1])
            batch[:] = saved
        return ClientResult(y)


class EditsBroadcastFromRoundTwo(FedAvg):
    """Moves the broadcast model in place from round 2 on (the pre-flight trains round 1)."""

    def client_train(self, task, ctx):
        if task.t >= 1:
            task.bc["x"].add_(0.01)
        return super().client_train(task, ctx)


class ZeroesXAfterTraining(FedAvg):
    """Trains, then zeroes the model it started from (ctx.x) from round 2 on."""

    def client_train(self, task, ctx):
        y = ctx.train()
        if task.t >= 1:
            ctx.x.mul_(0)
        return ClientResult(y)


class EditsViewOfState(Scaffold):
    """Edits a slice of its stored control variate (a view shares the tensor's counter)."""

    def client_train(self, task, ctx):
        if task.state is not None:
            task.state["c"][:3].zero_()
        return super().client_train(task, ctx)


class ResidualInPlace(ServerWrapper):
    """A client half that adds to its own stored state in place."""

    def client_apply(self, delta, t, client, ctx):
        if "seen" in ctx.state:
            ctx.state["seen"].add_(1.0)
        else:
            ctx.state["seen"] = torch.ones(1)
        return delta


class EditsAggregate(FedAvg):
    """A server rule that halves the round's mean update in place before stepping."""

    def server_update(self, x, state, agg, srv):
        agg.delta_mean.mul_(0.5)
        return super().server_update(x, state, agg, srv)


class StepsXInPlace(FedAvg):
    """A server rule that moves the model it is handed in place and returns it."""

    def server_update(self, x, state, agg, srv):
        return x.sub_(agg.delta_mean), state, {}


class GrowingBuffer(Linear):
    """Appends every forward's mean score to a registered buffer."""

    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.register_buffer("seen", torch.zeros(1))

    def forward(self, x):
        out = self.layer(x)
        self.seen = torch.cat([self.seen, out.detach().mean().reshape(1)])
        return out


class DoubleAfterFiveForwards(Linear):
    """Counts its forwards in a buffer, which turns float64 after the fifth."""

    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.register_buffer("forwards", torch.zeros(1))

    def forward(self, x):
        self.forwards.add_(1)
        if self.forwards.item() > 5 and self.forwards.dtype == torch.float32:
            self.forwards = self.forwards.double()
        return self.layer(x)


class ReassignedBuffer(Linear):
    """Keeps a running mean in a buffer it assigns anew every forward (same shape and dtype)."""

    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.register_buffer("mean", torch.zeros(input_shape[0]))

    def forward(self, x):
        self.mean = 0.9 * self.mean + 0.1 * x.detach().mean(0)
        return self.layer(x)


# ----- components that end the process, or pass for a Ctrl-C --------------------------------------
class ExitsInRoundTwo(FedAvg):
    """Calls sys.exit(0) in its client procedure from round 2 on."""

    def client_train(self, task, ctx):
        if task.t >= 1:
            sys.exit(0)
        return super().client_train(task, ctx)


class ExitsThree(FedAvg):
    """Calls sys.exit(3) (the code of a diverged run) in every client procedure."""

    def client_train(self, task, ctx):
        sys.exit(3)


class InterruptsInRoundTwo(FedAvg):
    """Raises KeyboardInterrupt itself in its client procedure from round 2 on."""

    def client_train(self, task, ctx):
        if task.t >= 1:
            raise KeyboardInterrupt
        return super().client_train(task, ctx)


class SelectorInterrupts(Selector):
    """Raises KeyboardInterrupt itself when it selects round 2."""

    def select(self, t, rng, online, m, losses):
        if t == 1:
            raise KeyboardInterrupt
        return rng.choice(online, m, replace=False)


class CtrlCInRoundTwo(FedAvg):
    """Sends this process a SIGINT (as Ctrl-C does) in round 2, then waits for it."""

    def client_train(self, task, ctx):
        if task.t >= 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)
        return super().client_train(task, ctx)


class ExitsWhileLoading:
    """A dataset whose loader calls SystemExit(0)."""

    @staticmethod
    def load(cfg, seed):
        raise SystemExit(0)


class ExitsWhenEvaluated(Linear):
    """Trains as a linear model; its evaluation forward on the test set (eval mode, more rows
    than the pre-flight's batches) calls sys.exit(0)."""

    def forward(self, x):
        if not self.training and len(x) > 100:
            sys.exit(0)
        return self.layer(x)


class InterruptsWhenEvaluated(Linear):
    """Trains as a linear model; its evaluation forward on the test set raises
    KeyboardInterrupt itself."""

    def forward(self, x):
        if not self.training and len(x) > 100:
            raise KeyboardInterrupt
        return self.layer(x)
