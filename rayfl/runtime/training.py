"""Training the clients of a round's groups, wherever an executor runs them.

:func:`train_groups` is what every executor does with the groups it is handed: for each client
in order, load its state, run the algorithm's local rule, pass the update through the
aggregation transforms, save the new state and add the result to the group's
:class:`PartialSum`. A Ray client actor, the in-process executor and the gradient-function
executor of the math tests (:func:`rayfl.runtime.harness.simulate`) all call it, so there is one
client code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

import numpy as np

from rayfl import rng
from rayfl.algorithms.base import (Algorithm, ClientResult, ClientTask, Vec, check_client_state,
                                   has)
from rayfl.runtime.aggregate import PartialSum
from rayfl.runtime.context import BUFFERS, ClientData, LocalContext
from rayfl.runtime.local import LocalSpec, train_client
from rayfl.transforms import split

#: one client's work order: (client id, aggregation weight, state version, step budget or None)
Work = tuple[int, float, int, "int | None"]


@dataclass
class ClientOutcome:
    """One client's round: final iterate, Δ_i, steps, mean loss and the algorithm's result."""

    y: Vec
    delta: Vec
    steps: int
    loss: float
    result: ClientResult


def run_client(algorithm: Algorithm, task: ClientTask, data: ClientData, spec: LocalSpec,
               rng: np.random.Generator, max_steps: int | None = None) -> ClientOutcome:
    """Local training of one client from ``task.bc["x"]``: the algorithm's client procedure
    when it has one, else the flat-vector loop under its :class:`LocalRule`."""
    x = task.bc["x"]
    if has(algorithm, "client_train"):
        ctx = LocalContext(task, data, spec, rng, max_steps)
        y, result = algorithm.client_train(task, ctx)
        return ClientOutcome(y, x - y, ctx.steps, ctx.mean_loss(), result)
    rule = algorithm.client_begin(task)
    y, steps, loss = train_client(rule, x, data.grad_fn, data.n, spec, task.lr, rng, max_steps)
    result = algorithm.client_end(task, y, steps)
    return ClientOutcome(y, x - y, steps, loss, result)


class Store(Protocol):
    """Versioned client state (:class:`rayfl.runtime.state_store.StateStore` or in memory)."""

    def load(self, client: int, version: int) -> dict[str, Vec] | None: ...

    def save(self, client: int, version: int, state: dict[str, Vec]) -> None: ...


class MemoryStore:
    """Client state in a dict (the math tests; no budget, nothing spilled)."""

    def __init__(self):
        self.states: dict[tuple[int, int], dict[str, Vec]] = {}

    def load(self, client: int, version: int) -> dict[str, Vec] | None:
        return self.states.get((client, version)) if version >= 0 else None

    def save(self, client: int, version: int, state: dict[str, Vec]) -> None:
        self.states[(client, version)] = state


#: client id -> the client's rows for the round
Source = Callable[[int], ClientData]


def train_groups(algorithm: Algorithm, groups: Iterable[tuple[int, Sequence[Work]]],
                 bc: dict[str, Vec], lr: float, t: int, seed: int, source: Source,
                 store: Store, spec: LocalSpec, transforms=None,
                 on_model: Callable[[int, Vec], None] | None = None, messages=None):
    """Train every client of every group; returns ([(group, PartialSum)], clients written).

    A client's state is settled first (the algorithm's ``client_settle`` with the ``messages``
    of the round that wrote it), when the algorithm has that capability.
    ``on_model(client, y)`` sees each client's final local model (analysis keeps them).
    """
    keep_models = has(algorithm, "receive_client_models")
    keep_updates = transforms is not None and transforms.needs_updates
    settle = has(algorithm, "client_settle")
    sums, written = [], []
    t_bc, bc = split(bc)  # the transforms' broadcast values never reach the algorithm
    global_buffers, bc = _without(bc, BUFFERS)
    for group, tasks in groups:
        acc = PartialSum()
        for client, weight, version, budget in tasks:
            data = source(client)
            t_state, state = split(store.load(client, version))
            own_buffers, state = _without(state, BUFFERS)
            if state is not None and settle:
                state = algorithm.client_settle(state, messages.load(version))
            if data.has_buffers:
                use_own = algorithm.local_buffers and own_buffers is not None
                data.model.set_buffers(own_buffers if use_own else global_buffers)
            task = ClientTask(client, t, lr, weight, bc, state,
                              spec.num_steps(data.n) if budget is None
                              else min(spec.num_steps(data.n), budget))
            out = run_client(algorithm, task, data, spec, rng.client_stream(seed, t, client), budget)
            if on_model is not None:
                on_model(client, out.y)
            delta, result = out.delta, out.result
            if result.state is not None:
                check_client_state(algorithm, result.state, out.y.numel())
            if transforms is not None:
                delta, t_state, extra = transforms.apply(delta, t, client, t_bc, t_state)
                result = ClientResult({**result.payload, **extra}, result.state)
            buffers = data.model.get_buffers() if data.has_buffers else None
            kept = {BUFFERS: buffers} if buffers is not None and algorithm.local_buffers else {}
            if result.state is not None or t_state or kept:  # a transform's state: EF residuals
                store.save(client, t, {**(result.state or {}), **t_state, **kept})
                written.append(client)
            acc.add_client(client, delta, weight, out.steps, data.n, out.loss, result,
                           out.y if keep_models else None, buffers, keep_updates)
        sums.append((group, acc))
    return sums, written


def _without(values: dict | None, key: str) -> tuple[Any, dict | None]:
    """(``values[key]`` or None, a copy of ``values`` without it, None when nothing is left)."""
    if not values or key not in values:
        return None, values
    rest = {k: v for k, v in values.items() if k != key}
    return values[key], rest or None
