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

Only the event logic lives here (clock, slots, arrivals, the trigger, staleness); dispatch,
grouping, merging, client-state versions, transforms and the server update are the synchronous
round's own (:class:`~rayfl.runtime.loop.RoundLoop`). The clients dispatched between two server
updates share a broadcast (the algorithm's and the transforms'); they form a *wave*, trained in
one ``RoundLoop.train`` call under the wave's index (one group per client, so Ray actors train
them in parallel), at the latest just before the model changes. A client's update depends only
on the seed, the wave index, its id, the broadcast and its state, and buffers are summed in the
sync round's order (ascending ids, LPT shards, groups in order), so the model bytes depend on
neither the actor count nor a pause: the in-flight set with its results, the clock and the
counters are checkpointed. With concurrency = buffer_size = clients_per_round and equal device
speeds every wave is a sync round and FedBuff at s ≡ 1 gives synchronous FedAvg's bytes.

Client state: a client's state version is the wave it was written in. A client is never
dispatched while in flight, so it has one copy training at a time, which reads the version its
previous run wrote (``RoundLoop.versions``); superseded versions are deleted after the next
checkpoint, as in synchronous rounds. So the transforms' per-client state (error-feedback
residuals) carries over between a client's runs; an arrival discarded as too stale keeps the
state its run wrote (the client ran and sent its update; the server ignored it). Algorithms
with client state of their own (SCAFFOLD, FedDyn, ...) stay refused: their client and server
updates are defined on synchronous rounds, and no staleness rule for them is decided.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from rayfl.algorithms.base import Aggregate
from rayfl.availability.empty import NobodyOnline
from rayfl.contract import ComponentError, name_of
from rayfl.layers import ServerState as State
from rayfl.rng import DROPOUT, SAMPLE, stream
from rayfl.runtime.aggregate import PartialSum
from rayfl.runtime.async_config import Settings
from rayfl.runtime.loop import RoundLoop, RoundOutcome, merge

IDLE_POLL_S = 60.0  # virtual seconds the server waits when no client is online and none flies
MAX_IDLE_POLLS = 100_000  # about 69 virtual days without a single client: the model is broken


@dataclass
class Job:
    """One dispatched client: when it arrives (or fails), from which model version, its
    aggregation weight and, once its wave has trained, its result (a sum of this client alone)."""

    time: float
    client: int
    seq: int  # dispatch order over the run
    version: int  # server updates applied when it was dispatched
    weight: float
    dropped: bool
    result: PartialSum | None = None  # holds Δ_i = x_version − y_i (after client transforms)

    def key(self) -> tuple:
        return (self.time, self.client, self.seq)


class Dispatcher:
    """Who is dispatched at an instant and when each arrives, from the sync rounds' sampler
    (its availability model, devices, upload size, local-step rule and random-stream keys)."""

    def __init__(self, sampler, seed: int, dropout: float):
        self.sampler, self.seed, self.dropout = sampler, seed, dropout

    def draw(self, d: int, now: float, free: int, busy: np.ndarray):
        """Dispatch event ``d`` at ``now``: (online count, clients ascending, seconds until each
        arrives or fails, failed flags). ``busy`` (the clients in flight) are never drawn, so
        a client has at most one copy in flight and one writer of its state."""
        s = self.sampler
        online = s.model.online(d, now)
        mask = np.ones(s.n, bool) if online is None else np.asarray(online, bool).copy()
        n_online = int(mask.sum())
        mask[busy] = False
        pool = np.flatnonzero(mask)
        m = min(free, len(pool))
        if m == 0:  # nobody to dispatch: nothing drawn (the server polls again, often)
            return n_online, np.empty(0, np.int64), np.empty(0), np.empty(0, bool)
        sampled = stream(self.seed, d, SAMPLE).choice(pool, m, replace=False)
        fate = stream(self.seed, d, DROPOUT)
        failed, when = fate.random(m) < self.dropout, fate.random(m)
        n_i = s.sizes[sampled]
        steps = np.array([s.spec.num_steps(int(v)) for v in n_i], dtype=np.int64)
        comm, step_s = s.devices.times(sampled, n_i, s.spec.batch_size, s.model_bytes,
                                       s.upload_bytes)
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


def refuse_uploads(mode: str, uploaded, algorithm, t: int | None) -> None:
    """Refuse the algorithm's Upload payload entries under asynchronous aggregation (a
    ComponentError naming its ``client_train``): the server weighs each update by its
    staleness (FedBuff) or mixes it into x (FedAsync), which the entries would need too."""
    if uploaded and mode != "sync":
        raise ComponentError(name_of(algorithm, "client_train"),
                             f"sent {', '.join(map(repr, uploaded))} as Upload payload under "
                             f"aggregation.mode {mode}: the server discounts each update by its "
                             "staleness, and the entries would need the same", t)


def discounted(ps: PartialSum, s: float) -> PartialSum:
    """One client's sum with Δ_i scaled by s (its weight p_i unscaled)."""
    if s == 1.0:
        return ps
    delta = ps.delta * s
    return dataclasses.replace(ps, delta=delta, delta_w=delta * ps.weight_sum,
                               delta_sq=float(torch.dot(delta.double(), delta.double())))


#: a client's sum's fields that only Upload entries fill (a snapshot leaves them out when empty)
UPLOAD_FIELDS = ("uploaded", "upload_sizes")

#: the entries of an event loop's checkpoint snapshot (:meth:`AsyncLoop.snapshot`)
SNAPSHOT = ("now", "version", "dispatches", "waves", "seq", "window_start", "jobs", "sent")


class AsyncLoop:
    """The event logic: clock, slots, arrivals, the trigger and staleness; everything else is
    the :class:`~rayfl.runtime.loop.RoundLoop`'s (``rounds``). :meth:`step` runs until the next
    server update."""

    def __init__(self, rounds: RoundLoop, settings: Settings, dispatcher: Dispatcher,
                 lr0: float, lr_decay: float):
        self.rounds, self.settings, self.dispatcher = rounds, settings, dispatcher
        self.lr0, self.lr_decay = lr0, lr_decay
        self.now, self.version, self.dispatches, self.waves, self.seq = 0.0, 0, 0, 0, 0
        self.jobs: dict[int, Job] = {}  # in flight, by seq
        self.heap: list[tuple] = []  # Job.key() of every job in flight
        self.sent: dict[int, torch.Tensor] = {}  # fedasync: x of versions still in flight
        self.window = Window()

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
        if not len(clients):
            return
        self.window.dispatched += len(clients)
        sizes = self.rounds.sizes[clients]
        weights = self.rounds.stack.weights(state, clients, sizes)
        for c, sec, dead, w in zip(clients, seconds, failed, weights):
            job = Job(self.now + float(sec), int(c), self.seq, self.version, float(w), bool(dead))
            self.seq += 1
            self.jobs[job.seq] = job
            heapq.heappush(self.heap, job.key())

    def _train_wave(self, state: State) -> None:
        """Train every dispatched, untrained, live job (all hold the current version) as wave
        ``waves``: one group per client; the states written get the wave as their version."""
        wave = sorted((j for j in self.jobs.values() if j.result is None and not j.dropped),
                      key=lambda j: j.seq)
        if not wave:
            return
        rounds, t = self.rounds, self.waves
        self.waves += 1
        bc = rounds.stack.broadcast(state, self.version)
        if self.settings.mode == "fedasync":
            self.sent[self.version] = bc.algorithm["x"]
        lr = rounds.stack.client_lr(state, self.version, self.lr0, self.lr_decay)
        clients = np.array([j.client for j in wave], dtype=np.int64)
        groups = rounds.groups(clients, [j.weight for j in wave], None,
                               [[i] for i in range(len(wave))])
        sums, reports, seconds = rounds.train(t, bc, lr, groups, None, np.sort(clients))
        self.window.train_s += seconds
        self.window.waves += 1
        self.window.trained += len(wave)
        self.window.reports += reports
        for g, job in enumerate(wave):
            job.result = sums[g]

    def step(self, state: State, t: int) -> RoundOutcome:
        """Run events until server update ``t`` is applied."""
        tick = time.perf_counter()
        buffer: list[tuple[Job, int]] = []
        idle = 0
        while True:
            if not self.heap or self.heap[0][0] > self.now:  # this instant's arrivals are done
                self._dispatch(state)
            if not self.heap:  # no one online: wait and look again
                idle += 1
                if idle > MAX_IDLE_POLLS:
                    raise NobodyOnline(f"no client was online for {idle * IDLE_POLL_S:g} virtual "
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
            if job.result is None:
                self.jobs[seq] = job  # trained with its wave
                self._train_wave(state)
                del self.jobs[seq]
            buffer.append((job, tau))
            if len(buffer) == self.settings.buffer_size:
                self._train_wave(state)  # the rest of this version's wave, before x changes
                return self._apply(state, t, buffer, tick)

    # ----- the server update ---------------------------------------------------------------
    def _apply(self, state: State, t: int, buffer: list[tuple[Job, int]], tick: float):
        rounds, w = self.rounds, self.window
        for job, _ in buffer:
            refuse_uploads(self.settings.mode, job.result.uploaded, rounds.algorithm, t)
        num_sampled = len(buffer) + w.dropped + w.discarded
        if self.settings.mode == "fedbuff":
            total, agg = self._buffer_sum(buffer), None
        else:
            (job, tau), = buffer
            total = job.result
            alpha = self.settings.mixing * self.settings.weight(tau)
            # α_t (x − y), y = x_τ − Δ
            direction = alpha * (total.delta + (state.x - self.sent[job.version]))
            agg = Aggregate(1, num_sampled, len(rounds.sizes), total.weight_sum, direction,
                            direction.clone(), float(direction.double().pow(2).sum()),
                            dict(total.extras))
        state, agg, own = rounds.update(state, total, t, num_sampled, agg)
        self.version += 1
        taus = np.array([tau for _, tau in buffer])
        metrics = {
            "online": w.online, "sampled": w.dispatched, "dropped": w.dropped,
            "discarded": w.discarded, "in_flight": len(self.jobs),
            "virtual_round_s": self.now - w.start, "virtual_time_s": self.now,
            "staleness_mean": float(taus.mean()), "staleness_max": int(taus.max()),
            "staleness_hist": np.bincount(taus).tolist(),
            "staleness_weight_mean": float(np.mean([self.settings.weight(int(v)) for v in taus])),
            "waves": w.waves, "clients_trained": w.trained, **own,
        }
        in_flight = {j.version for j in self.jobs.values()}
        self.sent = {v: x for v, x in self.sent.items() if v in in_flight}
        self.window = Window(start=self.now)
        seconds = time.perf_counter() - tick
        return RoundOutcome(state, agg, total, w.reports, metrics, w.train_s, seconds - w.train_s)

    def _buffer_sum(self, buffer: list[tuple[Job, int]]) -> PartialSum:
        """Σ over the buffer in the sync round's order: ascending ids, LPT shards, groups in
        order; each Δ_i scaled by s(τ_i), each weight p_i unscaled."""
        items = sorted(buffer, key=lambda item: (item[0].client, item[0].seq))
        parts = self.rounds.parts(np.array([job.client for job, _ in items], dtype=np.int64))
        return merge(merge(discounted(items[i][0].result, self.settings.weight(items[i][1]))
                           for i in part) for part in parts)

    # ----- checkpoints ---------------------------------------------------------------------
    def snapshot(self) -> dict:
        """Everything needed to continue exactly: clock, counters, in-flight jobs (with their
        results), models sent. The client-state versions are the round loop's (checkpointed)."""
        def job(j: Job) -> dict:
            out = {f.name: getattr(j, f.name) for f in fields(Job)}
            out["result"] = None if j.result is None else {  # as before, without entries
                k: v for k, v in vars(j.result).items() if k not in UPLOAD_FIELDS or v}
            return out

        return dict(zip(SNAPSHOT, (
            self.now, self.version, self.dispatches, self.waves, self.seq, self.window.start,
            [job(j) for j in sorted(self.jobs.values(), key=lambda j: j.seq)],
            [[v, x] for v, x in sorted(self.sent.items())])))

    def restore(self, snap: dict) -> None:
        self.now, self.version = snap["now"], snap["version"]
        self.dispatches, self.waves, self.seq = snap["dispatches"], snap["waves"], snap["seq"]
        self.window = Window(start=snap["window_start"])
        self.jobs = {}
        known = {f.name for f in fields(PartialSum)}  # rayfl 0.1 also kept client models
        for j in snap["jobs"]:
            result = j.pop("result")
            self.jobs[j["seq"]] = Job(**j, result=None if result is None else PartialSum(
                **{k: v for k, v in result.items() if k in known}))
        self.heap = sorted(j.key() for j in self.jobs.values())
        self.sent = {int(v): x for v, x in snap["sent"]}


def for_server(settings: Settings | None, local, seed: int, dropout: float,
               round_loop: RoundLoop, sampler) -> AsyncLoop | None:
    """The event-driven trigger over the server's round loop (None: ``settings`` None, in
    ``aggregation.mode: sync``); ``settings`` the ``aggregation`` section's
    (:meth:`Settings.of`), ``local`` the run's local section (its learning rate), ``dropout``
    ``availability.dropout``."""
    if settings is None:
        return None
    return AsyncLoop(round_loop, settings, Dispatcher(sampler, seed, dropout), local.lr,
                     local.lr_decay)
