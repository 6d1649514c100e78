"""One client's round, and a single-process round loop over explicit gradient functions.

:func:`run_client` is what a client actor does for each sampled client. :func:`simulate` drives
an algorithm in one process over clients given as gradient functions (quadratics in the tests):
the reference against which the math of every algorithm is checked, using the same client code
path and the same :class:`PartialSum` as the Ray runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from rayfl.algorithms.base import Algorithm, ClientResult, Vec
from rayfl.runtime.aggregate import PartialSum, drift_metrics
from rayfl.runtime.local import GradFn, LocalSpec, train_client

BATCH_STREAM = 1  # purpose tag of the minibatch-order generator


def client_rng(seed: int, t: int, client_id: int, purpose: int = BATCH_STREAM):
    """The generator for one (seed, round, client, purpose): independent of actor placement."""
    return np.random.default_rng([seed, t, client_id, purpose])


@dataclass
class ClientOutcome:
    """One client's round: final iterate, Δ_i, steps, mean loss and the algorithm's result."""

    y: Vec
    delta: Vec
    steps: int
    loss: float
    result: ClientResult


def run_client(algorithm: Algorithm, bc: dict[str, Vec], cstate: dict[str, Vec] | None,
               grad_fn: GradFn, n: int, spec: LocalSpec, lr: float, t: int, weight: float,
               rng: np.random.Generator, max_steps: int | None = None,
               client_id: int | None = None) -> ClientOutcome:
    """Local training of one client from ``bc["x"]`` under the algorithm's rule."""
    rule = algorithm.client_begin(bc, cstate, t, lr, client_id=client_id)
    y, steps, loss = train_client(rule, bc["x"], grad_fn, n, spec, lr, rng, max_steps)
    result = algorithm.client_end(bc, cstate, y, steps, lr, weight, t)
    return ClientOutcome(y, bc["x"] - y, steps, loss, result)


@dataclass
class Client:
    """A client for :func:`simulate`: a gradient function and its sample count."""

    grad_fn: GradFn
    n: int


def simulate(algorithm: Algorithm, x0: Vec, clients: Sequence[Client], spec: LocalSpec,
             rounds: int, lr0: float, lr_decay: float = 1.0, seed: int = 0,
             sample: Callable[[int], Sequence[int]] | None = None,
             state=None, client_states: dict | None = None, start_round: int = 0):
    """Run ``rounds`` rounds in-process; returns (server state, per-round metrics, client states).

    ``sample(t)`` gives the participants of round t (default: all clients).
    """
    state = algorithm.server_init(x0) if state is None else state
    client_states = {} if client_states is None else client_states
    history, prev = [], None
    for t in range(start_round, start_round + rounds):
        ids = list(range(len(clients))) if sample is None else sorted(sample(t))
        bc = algorithm.broadcast(state, t)
        lr = algorithm.local_lr(t, lr0, lr_decay)
        weights = algorithm.aggregation_weights(state, ids, [clients[i].n for i in ids])
        acc = PartialSum()
        for i, w in zip(ids, weights):
            out = run_client(algorithm, bc, client_states.get(i), clients[i].grad_fn,
                             clients[i].n, spec, lr, t, w, client_rng(seed, t, i), client_id=i)
            if out.result.state is not None:
                client_states[i] = out.result.state
            acc.add_client(i, out.delta, w, out.steps, clients[i].n, out.loss, out.result,
                           out.y if algorithm.needs_client_models else None)
        if algorithm.needs_client_models:
            state = algorithm.receive_client_models(state, acc.client_ids,
                                                    torch.stack(acc.client_models))
        agg = acc.finalize(len(ids), len(clients), x0.numel(), x0.dtype)
        state, metrics = algorithm.server_update(state, agg, t)
        metrics = {**drift_metrics(agg, prev), **metrics, "round": t}
        prev = agg.delta_mean
        history.append(metrics)
    return state, history, client_states


def quadratic_client(a: Vec, b: Vec, n: int = 1) -> Client:
    """Client with f_i(x) = ½ xᵀ diag(a) x − bᵀx (full-batch gradient, loss reported)."""

    def grad_fn(point: Vec, idx) -> tuple[torch.Tensor, Vec]:
        return 0.5 * (a * point * point).sum() - b @ point, a * point - b

    return Client(grad_fn, n)
