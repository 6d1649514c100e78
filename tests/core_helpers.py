"""Unit-test helpers for an algorithm's math on its own: one server update through a stack of
its own, and a client context whose local training ends where the test says."""

from __future__ import annotations

import dataclasses

from rayfl.algorithms.base import PLAIN_SGD
from rayfl.layers import ServerState, Stack


def stack_of(algo, opt=None) -> Stack:
    """The algorithm alone (with its own server optimiser unless ``opt``)."""
    return Stack(algo, opt or algo.default_server_opt())


def init(algo, x0, opt=None) -> ServerState:
    """The server state tree of a fresh run of ``algo`` from ``x0``."""
    return stack_of(algo, opt).init(x0)


def with_state(state: ServerState, **fields) -> ServerState:
    """``state`` with fields of the algorithm's slot replaced."""
    return dataclasses.replace(state, algorithm=dataclasses.replace(state.algorithm, **fields))


def update(algo, state: ServerState, agg, t: int, opt=None) -> tuple[ServerState, dict]:
    """One server update of ``algo`` alone: (new state, metrics)."""
    new, _, metrics = stack_of(algo, opt).update(state, agg, (), t)
    return new, metrics


class FixedTraining:
    """A local context whose training ends at ``y`` after ``steps`` steps (the client math of
    an algorithm checked by hand); it keeps the rule it was asked to train under."""

    def __init__(self, x, y, steps: int, lr: float = 0.1):
        self.x, self.y, self.steps, self.lr = x, y, steps, lr
        self.rule = None

    def train(self, rule=PLAIN_SGD, start=None):
        self.rule = rule
        return self.y.clone()


def local_update(algo, task, data, spec, rng):
    """Δ_i = x − y_i (or the client's own upload) of one client's local training."""
    from rayfl.runtime.context import LocalContext
    from rayfl.runtime.training import run_client

    result = run_client(algo, task, LocalContext(task, data, spec, rng, None))
    return task.bc["x"] - result.model if result.upload is None else result.upload
