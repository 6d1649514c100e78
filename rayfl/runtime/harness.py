"""The math tests' harness: clients given as gradient functions, run in this process.

:func:`simulate` runs an algorithm for some rounds over :class:`Client` gradient functions
(closed-form quadratics: :func:`quadratic_client`) through the same round loop and the same
client training code as a real run, with no model, data or Ray: the way to check an algorithm
against a hand computation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from rayfl.algorithms.base import Algorithm, Vec
from rayfl.algorithms.server_opt import ServerOpt
from rayfl.layers import ClientState, Layer, ServerState, Stack
from rayfl.runtime.client_state import decode, encode
from rayfl.runtime.context import ClientData
from rayfl.runtime.local import GradFn, LocalSpec
from rayfl.runtime.loop import RoundLoop
from rayfl.runtime.memory import peak_rss_mb, private_mb
from rayfl.runtime.messages import Messages
from rayfl.runtime.training import MemoryStore, train_groups


@dataclass
class Client:
    """A client given as a gradient function and its sample count (plus raw inputs, optional,
    for algorithms with the ``setup`` capability)."""

    grad_fn: GradFn
    n: int
    inputs: np.ndarray | None = None


class FunctionExecutor:
    """Runs groups in this process over :class:`Client` gradient functions."""

    def __init__(self, stack: Stack, clients: Sequence[Client], spec: LocalSpec,
                 seed: int = 0, store: MemoryStore | None = None,
                 messages: Messages | None = None):
        self.stack, self.clients, self.spec, self.seed = stack, clients, spec, seed
        self.store = store if store is not None else MemoryStore()
        self.messages = messages

    def summaries(self, client_ids) -> np.ndarray:
        setup = self.stack.algorithm.client_setup
        return np.stack([np.asarray(setup(self.clients[i].inputs, None), dtype=np.float64)
                         for i in client_ids])

    def run(self, t, bc, lr, groups, keep_dir=None, round_clients=None) -> list[dict]:
        source = (lambda c: ClientData(self.clients[c].n, self.clients[c].grad_fn))
        tick = time.perf_counter()
        sums, written = train_groups(self.stack, groups, bc, lr, t, self.seed, source,
                                     self.store, self.spec, messages=self.messages)
        return [{"sums": sums, "written": written, "seconds": time.perf_counter() - tick,
                 "peak_rss_mb": peak_rss_mb(), "private_mb": private_mb()}]


def simulate(algorithm: Algorithm, x0: Vec, clients: Sequence[Client], spec: LocalSpec,
             rounds: int, lr0: float, lr_decay: float = 1.0, seed: int = 0,
             sample: Callable[[int], Sequence[int]] | None = None,
             state: ServerState | None = None, client_states: dict | None = None,
             start_round: int = 0, transforms: Sequence[Layer] = (),
             wrappers: Sequence[Layer] = (), server_opt: ServerOpt | None = None):
    """Run ``rounds`` rounds in-process through the round loop; returns (server state tree,
    per-round metrics, latest client state trees by id).

    ``sample(t)`` gives the participants of round t (default: all clients). Clients with
    ``inputs`` go through the algorithm's ``setup`` capability before the first round.
    ``transforms`` and ``wrappers`` are the layers around the algorithm (:mod:`rayfl.layers`);
    ``server_opt`` its server optimiser (default: the algorithm's own).
    """
    stack = Stack(algorithm, server_opt or algorithm.default_server_opt(), list(wrappers),
                  list(transforms))
    store, messages = MemoryStore(), Messages(None)
    executor = FunctionExecutor(stack, clients, spec, seed, store, messages)
    loop = RoundLoop(stack, executor, np.array([c.n for c in clients]), shards=1,
                     messages=messages)
    for i, s in (client_states or {}).items():  # trees, or an algorithm's own entries
        store.save(i, start_round - 1, encode(s) if isinstance(s, ClientState) else s)
        loop.versions[i] = start_round - 1
    if state is None:
        state = stack.init(x0)
        if algorithm.traits.has("setup") and all(c.inputs is not None for c in clients):
            state = loop.setup(state)
    history, prev = [], None
    for t in range(start_round, start_round + rounds):
        ids = np.arange(len(clients)) if sample is None else np.sort(np.asarray(sample(t)))
        lr = stack.client_lr(state, t, lr0, lr_decay)
        out = loop.run(state, t, ids, None, lr, len(ids))
        state = out.state
        history.append({**out.drift(prev), **out.metrics, "round": t})
        prev = out.agg.delta_mean if out.agg.count else prev
    latest = {int(c): decode(store.load(int(c), int(v)), stack)
              for c, v in enumerate(loop.versions) if v >= 0}
    return state, history, latest


def quadratic_client(a: Vec, b: Vec, n: int = 1) -> Client:
    """Client with f_i(x) = ½ xᵀ diag(a) x − bᵀx (full-batch gradient, loss reported)."""

    def grad_fn(point: Vec, idx) -> tuple[torch.Tensor, Vec]:
        return 0.5 * (a * point * point).sum() - b @ point, a * point - b

    return Client(grad_fn, n)
