"""The math tests' harness: clients given as gradient functions, run in this process.

:func:`simulate` runs an algorithm for some rounds over :class:`Client` gradient functions
(closed-form quadratics: :func:`quadratic_client`) through the same round loop and the same
client training code as a real run, with no model, data or Ray: the way to check an algorithm
against a hand computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from rayfl.algorithms.base import Algorithm, Vec, has
from rayfl.runtime.context import ClientData
from rayfl.runtime.local import GradFn, LocalSpec
from rayfl.runtime.messages import Messages
from rayfl.runtime.training import MemoryStore, train_groups


@dataclass
class Client:
    """A client given as a gradient function and its sample count (plus raw inputs, optional,
    for algorithms with a ``client_setup`` capability)."""

    grad_fn: GradFn
    n: int
    inputs: np.ndarray | None = None


class FunctionExecutor:
    """Runs groups in this process over :class:`Client` gradient functions."""

    def __init__(self, algorithm: Algorithm, clients: Sequence[Client], spec: LocalSpec,
                 seed: int = 0, store: MemoryStore | None = None, transforms=None,
                 messages: Messages | None = None):
        self.algorithm, self.clients, self.spec, self.seed = algorithm, clients, spec, seed
        self.store = store if store is not None else MemoryStore()
        self.transforms = transforms
        self.messages = messages

    def summaries(self, client_ids) -> np.ndarray:
        return np.stack([np.asarray(self.algorithm.client_setup(self.clients[i].inputs, None),
                                    dtype=np.float64) for i in client_ids])

    def run(self, t, bc, lr, groups, keep_dir=None, round_clients=None) -> list[dict]:
        source = (lambda c: ClientData(self.clients[c].n, self.clients[c].grad_fn))
        sums, written = train_groups(self.algorithm, groups, bc, lr, t, self.seed, source,
                                     self.store, self.spec, self.transforms,
                                     messages=self.messages)
        return [{"sums": sums, "written": written}]


def simulate(algorithm: Algorithm, x0: Vec, clients: Sequence[Client], spec: LocalSpec,
             rounds: int, lr0: float, lr_decay: float = 1.0, seed: int = 0,
             sample: Callable[[int], Sequence[int]] | None = None,
             state=None, client_states: dict | None = None, start_round: int = 0,
             transforms=None):
    """Run ``rounds`` rounds in-process through the round loop; returns (server state,
    per-round metrics, latest client states by id).

    ``sample(t)`` gives the participants of round t (default: all clients). Clients with
    ``inputs`` go through the algorithm's ``client_setup`` capability before the first round.
    ``transforms`` is an aggregation-transform chain (:mod:`rayfl.transforms`).
    """
    from rayfl.runtime.loop import RoundLoop

    store, messages = MemoryStore(), Messages(None)
    executor = FunctionExecutor(algorithm, clients, spec, seed, store, transforms, messages)
    loop = RoundLoop(algorithm, executor, np.array([c.n for c in clients]), shards=1,
                     transforms=transforms, messages=messages)
    for i, s in (client_states or {}).items():
        store.save(i, start_round - 1, s)
        loop.versions[i] = start_round - 1
    if state is None:
        state = algorithm.server_init(x0)
        if has(algorithm, "client_setup") and all(c.inputs is not None for c in clients):
            state = loop.setup(state)
    history, prev = [], None
    for t in range(start_round, start_round + rounds):
        ids = np.arange(len(clients)) if sample is None else np.sort(np.asarray(sample(t)))
        lr = algorithm.local_lr(t, lr0, lr_decay)
        out = loop.run(state, t, ids, None, lr, len(ids))
        state = out.state
        history.append({**out.drift(prev), **out.metrics, "round": t})
        prev = out.agg.delta_mean if out.agg.count else prev
    latest = {int(c): store.load(int(c), int(v)) for c, v in enumerate(loop.versions) if v >= 0}
    return state, history, latest


def quadratic_client(a: Vec, b: Vec, n: int = 1) -> Client:
    """Client with f_i(x) = ½ xᵀ diag(a) x − bᵀx (full-batch gradient, loss reported)."""

    def grad_fn(point: Vec, idx) -> tuple[torch.Tensor, Vec]:
        return 0.5 * (a * point * point).sum() - b @ point, a * point - b

    return Client(grad_fn, n)
