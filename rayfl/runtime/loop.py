"""The round, written once: dispatch clients with their weights from a broadcast → execute them
in groups → merge the groups' partial sums in group order → record the client-state versions
written → aggregation transforms → server update.

Synchronous rounds run all of it per round (:meth:`RoundLoop.run`); FedBuff and FedAsync
(:mod:`rayfl.runtime.async_loop`) only decide when the server steps and with which staleness
weights, and call the same pieces: :meth:`~RoundLoop.broadcast`, :meth:`~RoundLoop.groups`,
:meth:`~RoundLoop.train`, :func:`merge`, :meth:`~RoundLoop.update` and
:meth:`RoundOutcome.row`.

An executor runs groups of clients somewhere (Ray actors, this process, gradient functions in
the math tests) and hands back each group's :class:`PartialSum`; groups depend only on the
dispatched set (balanced by sample count), and their sums are merged in group order, so the
model's bytes do not depend on where or on how many workers the groups ran.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

import numpy as np
import torch

from rayfl.algorithms.base import Aggregate
from rayfl.contract import calling, name_of
from rayfl.layers import Broadcast, ServerState, Stack, tensors
from rayfl.runtime.aggregate import PartialSum, drift_metrics
from rayfl.runtime.messages import Messages


def balance(loads: np.ndarray, bins: int) -> list[list[int]]:
    """Greedy LPT: item indices into ``bins`` bins, heaviest first; ties by lowest index."""
    out: list[list[int]] = [[] for _ in range(bins)]
    heap = [(0, b) for b in range(bins)]
    for i in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        load, b = heapq.heappop(heap)
        out[b].append(i)
        heapq.heappush(heap, (load + int(loads[i]), b))
    return out


def merge(sums: Iterable[PartialSum]) -> PartialSum:
    """The sums added in the order given (the order fixes the floating-point result)."""
    total = PartialSum()
    for s in sums:
        total.merge(s)
    return total


def actor_metrics(reports: list[dict]) -> dict:
    """Per-call load of a round (one report per busy actor): training seconds and samples of
    each, the slowest, the imbalance max/mean of the seconds, and the actors' memory."""
    seconds = [float(r["seconds"]) for r in reports]
    samples = [sum(acc.samples for _, acc in r["sums"]) for r in reports]
    mean = sum(seconds) / len(seconds) if seconds else 0.0
    return {"actor_train_s": seconds, "actor_samples": samples,
            "actor_train_s_max": max(seconds, default=0.0),
            "actor_imbalance": max(seconds) / mean if mean > 0 else 1.0,
            "actor_peak_rss_mb": max((r["peak_rss_mb"] for r in reports), default=0.0),
            "actor_private_mb": max((r["private_mb"] for r in reports), default=0.0)}


class Executor(Protocol):
    """Where clients train and are scored: every call the runtime makes on one (the Ray
    actors', this process's, the math tests' gradient functions)."""

    def run(self, t: int, bc: Broadcast, lr: float, groups: list[tuple[int, list]],
            keep_dir: str | None, round_clients: np.ndarray) -> list[dict]:
        """Train the groups: a list of reports (one per worker or call), each a dict holding
        ``"sums"`` [(group, PartialSum)], ``"written"`` (clients whose state it saved),
        ``"seconds"`` (its training time), ``"peak_rss_mb"`` and ``"private_mb"`` (its
        memory); together the sums of every group once."""

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        """The algorithm's one-off per-client summaries (``client_setup``) of ``client_ids``."""

    def client_scores(self, t: int, point, client_ids: np.ndarray, finetune, batch_size: int,
                      buffers=None, versions=None) -> np.ndarray:
        """Per-client evaluation (``eval.clients``): one row of scores per client."""

    def client_losses(self, point, client_ids: np.ndarray, batch_size: int,
                      buffers=None) -> np.ndarray:
        """Each candidate's loss at ``point`` (power-of-choice selection)."""


@dataclass
class RoundOutcome:
    """One server update's result: the new server state, the aggregate, the merged sums, the
    executor's per-call reports and the metrics of the algorithm, transforms and trigger."""

    state: ServerState
    agg: Aggregate
    total: PartialSum
    reports: list[dict]
    metrics: dict
    train_s: float  # executing the clients
    aggregate_s: float  # merging, transforms and the server update

    def drift(self, prev_delta: torch.Tensor | None) -> dict:
        """Update norm, client drift and period drift against the last round's Δ̄."""
        return drift_metrics(self.agg, prev_delta)

    def row(self, prev_delta: torch.Tensor | None) -> dict:
        """The metrics-row columns every round has, synchronous or event-driven."""
        total = self.total
        return {"completed": self.agg.count,
                "train_loss": total.loss_sum / total.count if total.count else float("nan"),
                "samples": total.samples, "local_steps": total.steps,
                **self.drift(prev_delta), **self.metrics,
                "train_s": self.train_s, "aggregate_s": self.aggregate_s,
                **actor_metrics(self.reports)}


class RoundLoop:
    """The server side of every round: weights, groups, merge, the layers and the update.

    ``versions[c]`` is the index under which client c's newest state was written (the round;
    in FedBuff/FedAsync the training wave), −1 for none; the loop sends it with each client's
    work so any worker loads the right version, and records the superseded versions in
    ``superseded`` for deletion after the next checkpoint.
    ``messages`` holds the rounds' messages to their clients (the ``settle`` capability).
    """

    def __init__(self, stack: Stack, executor: Executor, sizes: np.ndarray, shards: int,
                 messages: Messages | None = None):
        self.stack, self.executor, self.sizes = stack, executor, np.asarray(sizes)
        self.algorithm = stack.algorithm
        self.shards = shards
        self.messages = messages if messages is not None else Messages(None)
        self.versions = np.full(len(self.sizes), -1, dtype=np.int32)
        self.superseded: list[tuple[int, int]] = []

    def setup(self, state: ServerState) -> ServerState:
        """The algorithm's one-off set-up over every client (its ``setup`` capability)."""
        ids = np.arange(len(self.sizes))
        rows = self.executor.summaries(ids)
        own = self.algorithm.server_setup(state.algorithm, ids,
                                          torch.from_numpy(np.asarray(rows)))
        return dataclasses.replace(state, algorithm=own)

    def parts(self, clients: np.ndarray) -> list[list[int]]:
        """Positions in ``clients`` of each group: LPT by sample count over the shards."""
        return balance(self.sizes[clients], min(self.shards, len(clients)))

    def groups(self, clients: np.ndarray, weights: Sequence[float], budgets,
               parts: list[list[int]] | None = None) -> list:
        """[(group, [(client, weight, state version, budget)])]; ``parts`` (positions in
        ``clients`` per group) default to :meth:`parts`."""
        parts = self.parts(clients) if parts is None else parts
        return [(g, [(int(clients[i]), float(weights[i]), int(self.versions[clients[i]]),
                      None if budgets is None else int(budgets[i])) for i in part])
                for g, part in enumerate(parts)]

    def train(self, t: int, bc: Broadcast, lr: float, groups: list, keep_dir: str | None,
              round_clients: np.ndarray) -> tuple[dict[int, PartialSum], list[dict], float]:
        """Execute ``groups`` under index ``t`` and record the state versions written:
        (sums by group, the executor's reports, seconds)."""
        tick = time.perf_counter()
        reports = self.executor.run(t, bc, lr, groups, keep_dir, round_clients)
        seconds = time.perf_counter() - tick
        for r in reports:
            for c in r["written"]:
                if self.versions[c] >= 0:
                    self.superseded.append((c, int(self.versions[c])))
                self.versions[c] = t
        return dict(pair for r in reports for pair in r["sums"]), reports, seconds

    def update(self, state: ServerState, total: PartialSum, t: int, num_sampled: int,
               agg: Aggregate | None = None) -> tuple[ServerState, Aggregate, dict]:
        """Server update ``t`` from the merged ``total``: the aggregate (``agg``, or ``total``
        finalized) through the stack; returns (state, aggregate as the algorithm saw it,
        metrics)."""
        x = state.x
        if agg is None:
            agg = total.finalize(num_sampled, len(self.sizes), x.numel(), x.dtype)
        new, agg, own = self.stack.update(state, agg, total.layer_sums(len(self.stack.layers)),
                                          t)
        if self.algorithm.traits.has("settle") and total.count:
            name = name_of(self.algorithm, "round_message")
            with calling(name, round=t):
                message = self.algorithm.round_message(new.x, new.algorithm, agg, t)
            self.messages.save(t, tensors(message, name, "its message", t))
        sent = total.upload_bytes(lambda n: self.stack.upload_bytes(n, x.element_size()),
                                  x.numel())
        return new, agg, {**own, "upload_bytes": sent}

    def run(self, state: ServerState, t: int, clients: np.ndarray, budgets, lr: float,
            num_sampled: int, keep_dir: str | None = None) -> RoundOutcome:
        """Round ``t`` over the dispatched ``clients`` (``num_sampled`` counts dropped ones too)."""
        clients = np.asarray(clients, dtype=np.int64)
        weights = self.stack.weights(state, clients, self.sizes[clients])
        groups = self.groups(clients, weights, budgets)
        sums, reports, train_s = self.train(t, self.stack.broadcast(state, t), lr, groups,
                                            keep_dir, clients)
        tick = time.perf_counter()
        total = merge(sums[g] for g in sorted(sums))
        state, agg, own = self.update(state, total, t, num_sampled)
        return RoundOutcome(state, agg, total, reports, own, train_s, time.perf_counter() - tick)
