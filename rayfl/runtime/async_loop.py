"""FedBuff and FedAsync: event-driven aggregation on the virtual clock, executed for real.

``aggregation.concurrency`` clients are in flight at once. A client is dispatched with the model
version current at that instant and arrives at its simulated completion time (the sync rounds'
device model: compute = device speed × local steps, transfers = model bytes / bandwidth), or
fails part-way with probability ``availability.dropout`` (or is lost at that time when the
availability model has it offline by then). A freed slot is refilled at once from
the online clients not in flight; slots freed at the same instant are refilled together, after
every arrival at that instant is processed. Arrivals are processed in (time, client id, dispatch
order). FedBuff (Nguyen et al. 2022) buffers arrivals and applies
    Δ̄ = Σ_i p_i s(τ_i) Δ_i / Σ_i p_i,   x ← x − opt(Δ̄)     every ``buffer_size`` arrivals;
FedAsync (Xie et al. 2019) applies every arrival y_i = x_τ − Δ_i as
    x ← x − opt(α s(τ) (x − y_i)),     i.e. x ← (1 − α_t) x + α_t y_i for SGD at η_g = 1.
τ_i is the number of server updates since client i's model was sent; s is the staleness weight.

Execution: the clients dispatched between two server updates share a broadcast; they form a
*wave*, trained in one ``executor.run`` call (one group per client, so Ray actors train them in
parallel), at the latest just before the model changes. A client's update depends only on the
seed, the wave index, its id and the broadcast, and buffers are summed in the sync round's order
(ascending ids, LPT shards, groups in order), so the model bytes depend on neither the actor
count nor a pause: the in-flight set, the clock and the counters are checkpointed. With
concurrency = buffer_size = clients_per_round and equal device speeds every wave is a sync round
and FedBuff at s ≡ 1 gives synchronous FedAvg's bytes.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from rayfl.algorithms.base import Aggregate, Algorithm, State
from rayfl.availability.base import DROPOUT, SAMPLE
from rayfl.runtime.aggregate import PartialSum, drift_metrics
from rayfl.runtime.executors import actor_metrics
from rayfl.runtime.loop import balance
from rayfl.schema import ConfigError

IDLE_POLL_S = 60.0  # virtual seconds the server waits when no client is online and none flies
MAX_IDLE_POLLS = 100_000  # about 69 virtual days without a single client: the model is broken


def staleness_weight(kind: str, tau: int, a: float = 0.5, b: int = 4) -> float:
    """s(τ): ``constant`` 1; ``polynomial`` (1 + τ)^−a; ``hinge`` 1 for τ ≤ b, else
    1 / (a (τ − b) + 1) (Xie et al. 2019, FedAsync)."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + tau) ** -a)
    return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


def check_config(cls, cfg) -> None:
    """Refuse what the event-driven modes cannot honour, naming the key and the reason."""
    from rayfl.algorithms import registry

    mode = cfg.aggregation.mode
    if not cls.asynchronous_ok:
        ok = ", ".join(n for n in registry.names() if registry.get(n).asynchronous_ok)
        raise ConfigError("aggregation.mode", mode,
                          f"sync with {cls.name} ({cls.synchronous_reason}; algorithms "
                          f"defined asynchronously: {ok})")
    av = cfg.availability
    refused = [  # (key, value, refused when, expected)
        ("ima", "(set)", cfg.ima is not None,
         "no ima section (IMA averages the models of consecutive synchronous rounds)"),
        ("privacy", "(set)", cfg.privacy is not None,
         "no privacy section (the accountant assumes uniformly sampled synchronous rounds)"),
        ("availability.deadline_s", av.deadline_s, av.deadline_s is not None,
         "null (a round deadline has no meaning without rounds)"),
        ("availability.stragglers", av.stragglers, av.stragglers > 0,
         "0 (device speeds already make clients late; stragglers cut a synchronous round)"),
        ("availability.overcommit", av.overcommit, av.overcommit != 1.0,
         "1 (slots are refilled as clients arrive; nothing to over-commit)"),
        ("availability.interval_s", av.interval_s, av.interval_s != 0.0,
         "0 (the server never idles between rounds)"),
        ("data.regime", cfg.data.regime, cfg.data.regime is not None,
         "null (the drift regimes re-split a synchronous round's data)"),
        ("keep.rounds", cfg.keep.rounds, bool(cfg.keep.rounds),
         "empty (kept rounds are synchronous rounds)"),
        ("keep.last", cfg.keep.last, cfg.keep.last > 0,
         "0 (kept rounds are synchronous rounds)"),
    ]
    for key, value, bad, expected in refused:
        if bad:
            raise ConfigError(key, value, f"{expected} with aggregation.mode {mode}")
    trainable = cfg.data.num_clients - cfg.data.validation_clients
    concurrency = cfg.aggregation.concurrency or cfg.clients_per_round
    if concurrency > trainable:
        raise ConfigError("aggregation.concurrency", concurrency,
                          f"at most data.num_clients - data.validation_clients = {trainable}")


@dataclass
class Job:
    """One dispatched client: when it arrives (or fails), from which model version, its
    aggregation weight and, once its wave has trained, its update."""

    time: float
    client: int
    seq: int  # dispatch order over the run
    version: int  # server updates applied when it was dispatched
    weight: float
    dropped: bool
    trained: bool = False
    delta: torch.Tensor | None = None  # Δ_i = x_version − y_i (after client transforms)
    steps: int = 0
    samples: int = 0
    loss: float = 0.0
    extras: dict = field(default_factory=dict)

    def key(self) -> tuple:
        return (self.time, self.client, self.seq)


@dataclass
class Settings:
    """The ``aggregation`` keys of an event-driven run, resolved."""

    mode: str  # fedbuff | fedasync
    concurrency: int
    buffer_size: int
    staleness: str = "polynomial"
    a: float = 0.5
    b: int = 4
    max_staleness: int | None = None
    mixing: float = 0.6

    @classmethod
    def from_config(cls, cfg) -> Settings:
        ag = cfg.aggregation
        return cls(ag.mode, ag.concurrency or cfg.clients_per_round,
                   1 if ag.mode == "fedasync" else ag.buffer_size or cfg.clients_per_round,
                   ag.staleness, ag.staleness_a, ag.staleness_b, ag.max_staleness, ag.mixing)

    def weight(self, tau: int) -> float:
        return staleness_weight(self.staleness, tau, self.a, self.b)


class Dispatcher:
    """Who is dispatched at an instant and when each arrives, from the sync rounds' sampler
    (its availability model, devices, local-step rule and random-stream keys)."""

    def __init__(self, sampler, seed: int, dropout: float):
        self.sampler, self.seed, self.dropout = sampler, seed, dropout

    def draw(self, d: int, now: float, free: int, busy: np.ndarray):
        """Dispatch event ``d`` at ``now``: (online count, clients ascending, seconds until each
        arrives or fails, failed flags)."""
        s = self.sampler
        online = s.model.online(d, now)
        mask = np.ones(s.n, bool) if online is None else np.asarray(online, bool).copy()
        n_online = int(mask.sum())
        mask[busy] = False
        pool = np.flatnonzero(mask)
        m = min(free, len(pool))
        sampled = np.random.default_rng([self.seed, d, SAMPLE]).choice(pool, m, replace=False)
        fate = np.random.default_rng([self.seed, d, DROPOUT])
        failed, when = fate.random(m) < self.dropout, fate.random(m)
        n_i = s.sizes[sampled]
        steps = np.array([s.spec.num_steps(int(v)) for v in n_i], dtype=np.int64)
        comm, step_s = s.devices.times(sampled, n_i, s.spec.batch_size, s.model_bytes)
        full = comm + steps * step_s
        here = s.model.online_at(sampled, now + full)
        seconds = np.where(failed, when, 1.0) * full  # a dropout fails part-way
        if here is not None:  # offline when it would report: lost, found out then (FedScale)
            failed = failed | ~here
        order = np.argsort(sampled)
        return n_online, sampled[order].astype(np.int64), seconds[order], failed[order]


@dataclass
class Window:
    """What happened since the last server update (one metrics row)."""

    start: float = 0.0
    online: int = 0
    dispatched: int = 0
    dropped: int = 0
    discarded: int = 0
    waves: int = 0
    trained: int = 0
    train_s: float = 0.0
    reports: list = field(default_factory=list)


class AsyncLoop:
    """The event loop: dispatch, train waves, process arrivals, apply buffered updates.

    ``executor`` is any :class:`~rayfl.runtime.loop.Executor`; ``shards`` orders a buffer's sum
    as the sync round orders its groups. :meth:`step` runs until the next server update.
    """

    def __init__(self, algorithm: Algorithm, executor, sizes: np.ndarray, shards: int,
                 settings: Settings, dispatcher: Dispatcher, lr0: float, lr_decay: float,
                 transforms=None):
        self.algorithm, self.executor, self.sizes = algorithm, executor, np.asarray(sizes)
        self.shards, self.settings, self.dispatcher = shards, settings, dispatcher
        self.lr0, self.lr_decay, self.transforms = lr0, lr_decay, transforms
        self.now, self.version, self.dispatches, self.waves, self.seq = 0.0, 0, 0, 0, 0
        self.jobs: dict[int, Job] = {}  # in flight, by seq
        self.heap: list[tuple] = []  # Job.key() of every job in flight
        self.sent: dict[int, torch.Tensor] = {}  # fedasync: x of versions still in flight
        self.window = Window()
        self.last: tuple[PartialSum, Window] | None = None  # the last update's sum and window

    # ----- events ------------------------------------------------------------------------
    def _dispatch(self, state: State) -> None:
        free = self.settings.concurrency - len(self.jobs)
        if free <= 0:
            return
        busy = np.array([j.client for j in self.jobs.values()], dtype=np.int64)
        n_online, clients, seconds, failed = self.dispatcher.draw(self.dispatches, self.now,
                                                                  free, busy)
        self.dispatches += 1
        self.window.online = n_online
        self.window.dispatched += len(clients)
        weights = self.algorithm.aggregation_weights(state, clients, self.sizes[clients])
        for c, sec, dead, w in zip(clients, seconds, failed, weights):
            job = Job(self.now + float(sec), int(c), self.seq, self.version, float(w), bool(dead))
            self.seq += 1
            self.jobs[job.seq] = job
            heapq.heappush(self.heap, job.key())

    def _train_wave(self, state: State) -> None:
        """Train every dispatched, untrained, live job (all hold the current version)."""
        wave = sorted((j for j in self.jobs.values() if not j.trained and not j.dropped),
                      key=lambda j: j.seq)
        if not wave:
            return
        algo, t = self.algorithm, self.waves
        self.waves += 1
        bc = algo.broadcast(state, self.version)
        if self.settings.mode == "fedasync":
            self.sent[self.version] = bc["x"]
        lr = algo.local_lr(self.version, self.lr0, self.lr_decay)
        groups = [(g, [(j.client, j.weight, -1, None)]) for g, j in enumerate(wave)]
        tick = time.perf_counter()
        reports = self.executor.run(t, bc, lr, groups, None,
                                    np.sort(np.array([j.client for j in wave], dtype=np.int64)))
        self.window.train_s += time.perf_counter() - tick
        self.window.waves += 1
        self.window.trained += len(wave)
        self.window.reports += reports
        sums = dict(pair for r in reports for pair in r["sums"])
        for g, job in enumerate(wave):
            ps = sums[g]
            job.trained, job.delta, job.steps, job.samples = True, ps.delta, ps.steps, ps.samples
            job.loss, job.extras = ps.loss_sum, dict(ps.extras)

    def step(self, state: State, t: int) -> tuple[State, Aggregate, dict]:
        """Run events until server update ``t`` is applied; returns (state, aggregate, metrics)."""
        buffer: list[tuple[Job, int]] = []
        idle = 0
        while True:
            if not self.heap or self.heap[0][0] > self.now:  # this instant's arrivals are done
                self._dispatch(state)
            if not self.heap:  # no one online: wait and look again
                idle += 1
                if idle > MAX_IDLE_POLLS:
                    raise RuntimeError(f"no client was online for {idle * IDLE_POLL_S:g} virtual "
                                       "seconds; check the availability model")
                self.now += IDLE_POLL_S
                continue
            when, _, seq = heapq.heappop(self.heap)
            job = self.jobs.pop(seq)
            self.now = when
            if job.dropped:
                self.window.dropped += 1
                continue
            tau = self.version - job.version
            if self.settings.max_staleness is not None and tau > self.settings.max_staleness:
                self.window.discarded += 1
                continue
            if not job.trained:
                self.jobs[seq] = job  # trained with its wave
                self._train_wave(state)
                del self.jobs[seq]
            buffer.append((job, tau))
            if len(buffer) == self.settings.buffer_size:
                self._train_wave(state)  # the rest of this version's wave, before x changes
                return self._apply(state, t, buffer)

    # ----- the server update ---------------------------------------------------------------
    def _apply(self, state: State, t: int, buffer: list[tuple[Job, int]]):
        algo = self.algorithm
        x = algo.deployed(state)
        w = self.window
        num_sampled = len(buffer) + w.dropped + w.discarded
        if self.settings.mode == "fedbuff":
            total = self._buffer_sum(buffer)
            agg = total.finalize(num_sampled, len(self.sizes), x.numel(), x.dtype)
        else:
            (job, tau), = buffer
            alpha = self.settings.mixing * self.settings.weight(tau)
            start = self.sent[job.version]
            direction = alpha * (job.delta + (state["x"] - start))  # α_t (x − y), y = x_τ − Δ
            total = PartialSum()
            total.add_client(job.client, job.delta, job.weight, job.steps, job.samples, job.loss,
                             _Result(job.extras))
            agg = Aggregate(1, num_sampled, len(self.sizes), job.weight, direction,
                            direction.clone(), float(direction.double().pow(2).sum()),
                            dict(job.extras))
        if self.transforms is not None:
            agg = self.transforms.aggregate(agg, t)
        state, own = algo.server_update(state, agg, t)
        self.version += 1
        taus = np.array([tau for _, tau in buffer])
        metrics = {
            "online": w.online, "sampled": w.dispatched, "completed": len(buffer),
            "dropped": w.dropped, "discarded": w.discarded, "in_flight": len(self.jobs),
            "virtual_round_s": self.now - w.start, "virtual_time_s": self.now,
            "staleness_mean": float(taus.mean()), "staleness_max": int(taus.max()),
            "staleness_hist": np.bincount(taus).tolist(),
            "staleness_weight_mean": float(np.mean([self.settings.weight(int(v)) for v in taus])),
            "waves": w.waves, "clients_trained": w.trained, **own,
        }
        in_flight = {j.version for j in self.jobs.values()}
        self.sent = {v: x for v, x in self.sent.items() if v in in_flight}
        self.last = (total, w)
        self.window = Window(start=self.now)
        return state, agg, metrics

    def _buffer_sum(self, buffer: list[tuple[Job, int]]) -> PartialSum:
        """Σ over the buffer in the sync round's order: ascending ids, LPT shards, groups in
        order; each Δ_i scaled by s(τ_i), each weight p_i unscaled."""
        items = sorted(buffer, key=lambda item: (item[0].client, item[0].seq))
        loads = self.sizes[[job.client for job, _ in items]]
        total = PartialSum()
        for part in balance(loads, min(self.shards, len(items))):
            acc = PartialSum()
            for i in part:
                job, tau = items[i]
                s = self.settings.weight(tau)
                delta = job.delta if s == 1.0 else job.delta * s
                acc.add_client(job.client, delta, job.weight, job.steps, job.samples, job.loss,
                               _Result(job.extras))
            total.merge(acc)
        return total

    # ----- checkpoints ---------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Everything needed to continue exactly: clock, counters, in-flight jobs, models sent."""
        return {"now": self.now, "version": self.version, "dispatches": self.dispatches,
                "waves": self.waves, "seq": self.seq, "window_start": self.window.start,
                "jobs": [{f.name: getattr(j, f.name) for f in fields(Job)}
                         for j in sorted(self.jobs.values(), key=lambda j: j.seq)],
                "sent": [[v, x] for v, x in sorted(self.sent.items())]}

    def restore(self, snap: dict) -> None:
        self.now, self.version = snap["now"], snap["version"]
        self.dispatches, self.waves, self.seq = snap["dispatches"], snap["waves"], snap["seq"]
        self.window = Window(start=snap["window_start"])
        self.jobs = {j["seq"]: Job(**j) for j in snap["jobs"]}
        self.heap = sorted(j.key() for j in self.jobs.values())
        self.sent = {int(v): x for v, x in snap["sent"]}


@dataclass
class _Result:
    """The payload view :meth:`PartialSum.add_client` reads."""

    payload: dict


class AsyncRounds:
    """The server's hook: one metrics row per server update (``Server.round`` in async modes)."""

    def __init__(self, loop: AsyncLoop):
        self.loop = loop

    def round(self, server, t: int) -> dict:
        tick = time.perf_counter()
        state, agg, metrics = self.loop.step(server.state, t)
        total, window = self.loop.last
        server.state = state
        drift = drift_metrics(agg, server.prev_delta)
        server.prev_delta = agg.delta_mean if agg.count else server.prev_delta
        server.virtual_time = self.loop.now
        round_s = time.perf_counter() - tick
        return {
            **metrics, "round": t,
            "lr": server.algorithm.local_lr(t, server.cfg.local.lr, server.cfg.local.lr_decay),
            "train_loss": total.loss_sum / max(total.count, 1),
            "samples": total.samples, "local_steps": total.steps, **drift,
            "train_s": window.train_s, "aggregate_s": round_s - window.train_s, "plan_s": 0.0,
            **actor_metrics(window.reports),
            "round_s": round_s,
        }


def for_server(cfg, algorithm: Algorithm, round_loop, sampler) -> AsyncRounds | None:
    """The event-driven rounds of ``cfg`` (None in ``aggregation.mode: sync``)."""
    if cfg.aggregation.mode == "sync":
        return None
    loop = AsyncLoop(algorithm, round_loop.executor, round_loop.sizes, round_loop.shards,
                     Settings.from_config(cfg),
                     Dispatcher(sampler, cfg.seed, cfg.availability.dropout),
                     cfg.local.lr, cfg.local.lr_decay, round_loop.transforms)
    return AsyncRounds(loop)
