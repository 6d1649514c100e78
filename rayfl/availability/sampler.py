"""The round planner: online model → sampling → failures → stragglers → plan and virtual clock.

Per round t starting at virtual time ``now``: the online model says who is online at ``now``;
``ceil(K · overcommit)`` online clients are sampled by the selector (``selection.*``: uniformly
by default), or, with ``poisson_rate`` q, each online client independently with probability q;
each fails mid-round with
probability ``dropout`` or is offline when it would report (models with continuous online
intervals, such as ``trace``); the first K survivors to finish are kept (FedScale over-commitment);
a kept client whose finish time passes the deadline, or one of the ``stragglers`` fraction that
has time for only part of its epochs (FedProx), is dropped or keeps the steps it finished
(``deadline_policy``). The round lasts until the last kept client reports (or the deadline, if
it cut someone), plus ``interval_s``. Everything is O(N) numpy work at most.
"""

from __future__ import annotations

import math

import numpy as np

from rayfl.availability.base import RoundPlan
from rayfl.rng import DROPOUT, SAMPLE, STRAGGLE, stream
from rayfl.availability.checked import CheckedAvailability
from rayfl.availability.config import AvailabilityConfig
from rayfl.availability.devices import Devices
from rayfl.availability.labels import LabelStats
from rayfl.contract import calling, name_of
from rayfl.selection import SelectionConfig, SelectionContext
from rayfl.selection.checked import CheckedSelector


class Sampler:
    """Plans every round; keeps the virtual clock when the caller does not pass it. The
    availability model and the selector are called through their checked contracts
    (:mod:`rayfl.availability.checked`, :mod:`rayfl.selection.checked`)."""

    def __init__(self, cfg: AvailabilityConfig, model, stats: LabelStats, sizes: np.ndarray,
                 clients_per_round: int, seed: int, spec, model_bytes: int = 0,
                 poisson_rate: float | None = None, upload_bytes: float | None = None,
                 selection=None):
        self.cfg, self.stats, self.spec = cfg, stats, spec
        self.sizes, self.n = sizes, len(sizes)
        self.model = CheckedAvailability(model, self.n)
        self.k, self.seed, self.model_bytes = clients_per_round, seed, model_bytes
        self.upload_bytes = model_bytes if upload_bytes is None else upload_bytes
        self.draw = math.ceil(round(clients_per_round * cfg.overcommit, 9))
        self.devices = Devices(cfg, self.n, seed)
        self.clock = 0.0
        self.poisson_rate = poisson_rate  # each online client joins with this probability
        selection = selection or SelectionConfig()
        cls = selection.component()
        with calling(name_of(cls, "__init__")):
            selector = cls(selection.params, SelectionContext(sizes, seed, self.round_duration))
        self.selector = CheckedSelector(selector, self.n)

    def times(self, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(K_i, transfer seconds, seconds per step) of each of ``clients``."""
        n_i = self.sizes[clients]
        steps = np.array([self.spec.num_steps(int(s)) for s in n_i], dtype=np.int64)
        comm, step_s = self.devices.times(clients, n_i, self.spec.batch_size, self.model_bytes,
                                          self.upload_bytes)
        return steps, comm, step_s

    def round_duration(self, clients: np.ndarray) -> np.ndarray:
        """Virtual seconds each of ``clients`` takes for a full round: transfers and K_i steps."""
        steps, comm, step_s = self.times(clients)
        return comm + steps * step_s

    def plan(self, t: int, now: float | None = None, losses=None,
             eligible: np.ndarray | None = None) -> RoundPlan:
        """Round ``t``'s plan; ``now`` is its virtual start (default: the end of the last plan);
        ``losses`` (candidate ids -> their losses) scores the candidates of a selector that
        ``scores_candidates``; ``eligible`` (a mask over the clients: a participation bound of
        the privacy mechanism) removes the others before anyone is sampled."""
        cfg = self.cfg
        start = self.clock if now is None else float(now)
        online = self.model.online(t, start)
        n_online = self.n if online is None else int(np.count_nonzero(online))
        members = np.arange(self.n) if online is None else np.flatnonzero(online)
        if eligible is not None:
            members = members[eligible[members]]
        rng = stream(self.seed, t, SAMPLE)
        if self.poisson_rate is None:  # ceil(K · overcommit) of the online (eligible) clients
            m = min(self.draw, len(members))
            sampled = self.selector.select(t, rng, members, m, losses)
        else:  # Poisson sampling (DP accounting): every online client independently
            sampled = members[rng.random(len(members)) < self.poisson_rate]
            m = len(sampled)
        failed = stream(self.seed, t, DROPOUT).random(m) < cfg.dropout
        alive = sampled[~failed].astype(np.int64)

        steps, comm, step_s = self.times(alive)
        finish = comm + steps * step_s
        report = finish if cfg.deadline_s is None else np.minimum(finish, cfg.deadline_s)
        here = self.model.online_at(alive, start + report)
        offline = 0 if here is None else int(np.count_nonzero(~here))
        if here is not None:  # offline when it would report: lost (FedScale)
            alive, steps, comm, step_s, finish = (a[here] for a in (alive, steps, comm, step_s,
                                                                     finish))
        keep = self.k if self.poisson_rate is None else m
        first = np.lexsort((alive, finish))[:keep]  # the first K to finish
        kept, steps, comm, step_s, finish = (a[first] for a in (alive, steps, comm, step_s,
                                                                 finish))
        budget = steps.copy()
        late = np.zeros(len(kept), bool) if cfg.deadline_s is None else finish > cfg.deadline_s
        if late.any():  # partial: the steps that fit before the deadline, after the transfers
            budget[late] = 0 if cfg.deadline_policy == "drop" else np.floor(
                (cfg.deadline_s - comm[late]) / step_s[late]).clip(0)
        idle = budget == 0  # cut by the deadline (or no step to take), before any straggler
        slow = self._stragglers(t, steps, budget)
        done = np.flatnonzero(budget > 0)
        done = done[np.argsort(kept[done])]  # dispatched in ascending client order
        clients, budget, partial = kept[done], budget[done], (budget[done] < steps[done]).any()

        duration = cfg.deadline_s if late.any() else float(finish.max(initial=0.0))
        duration += cfg.interval_s
        self.clock = start + duration
        metrics = {"online": n_online, "sampled": m, "completed": len(clients),
                   "dropped": m - len(clients), "stragglers": int((late | slow).sum()),
                   "virtual_round_s": duration, "virtual_time_s": self.clock}
        if eligible is not None:
            metrics["eligible"] = len(members)
        if len(clients):
            metrics["label_tv"] = self.stats.tv(clients)
        else:
            metrics["empty_reason"] = self._why_empty(n_online, m, len(members), {
                "dropped out": int(np.count_nonzero(failed)),
                "went offline before reporting": offline,
                "missed the deadline": int(np.count_nonzero(idle & late)),
                "had no step to take": int(np.count_nonzero(idle & ~late & (steps == 0))),
                "straggled": int(np.count_nonzero(slow & ~idle))})
        return RoundPlan(clients=clients, step_budget=budget if partial else None,
                         dropped=np.setdiff1d(sampled, clients).astype(np.int64),
                         duration=duration, metrics=metrics)

    def _why_empty(self, online: int, sampled: int, eligible: int, lost: dict[str, int]
                   ) -> str:
        """Why no client of a round completed: nobody online, none eligible under the privacy
        mechanism's participation bound (``eligible``: the online clients it lets the round
        sample), none sampled, or what became of the sampled ones (``lost``: how many dropped
        out, went offline, missed the deadline, had no step to take or straggled)."""
        if online == 0:
            return "no client online"
        if eligible == 0:
            return (f"the participation bound left none of the {online} online clients "
                    "eligible (privacy.min_separation rounds between a client's rounds, at "
                    "most privacy.max_participations of them)")
        if sampled == 0 and self.poisson_rate is not None:
            return f"Poisson sampling drew none of the {online} online clients"
        if sampled == 0:
            return f"none of the {eligible} online clients was sampled"
        cfg = self.cfg
        settings = {"dropped out": f"availability.dropout = {cfg.dropout:g}",
                    "missed the deadline": f"availability.deadline_s = {cfg.deadline_s or 0:g} s",
                    "straggled": f"availability.stragglers = {cfg.stragglers:g}, deadline_policy "
                                 "drop"}
        return f"of {sampled} sampled: " + ", ".join(
            f"{n} {what}" + (f" ({settings[what]})" if what in settings else "")
            for what, n in lost.items() if n)

    def _stragglers(self, t: int, steps: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """FedProx's stragglers among the kept clients: ``round(stragglers · kept)`` of them,
        each with time for a uniform whole number of epochs in 1..E−1 (steps in 1..K−1 under
        ``local.steps``); their budget shrinks to it, or to 0 under the drop policy. Returns
        the mask of stragglers; the round's duration is unchanged (they stop early)."""
        slow = np.zeros(len(steps), bool)
        count = int(round(self.cfg.stragglers * len(steps)))
        if count == 0:
            return slow
        rng = stream(self.seed, t, STRAGGLE)
        slow[rng.choice(len(steps), count, replace=False)] = True
        spec = self.spec
        units = np.full(len(steps), spec.steps) if spec.steps is not None else np.full(
            len(steps), spec.epochs)
        per_unit = steps // units  # steps per epoch (1 under local.steps)
        done = rng.integers(1, np.maximum(units - 1, 1), endpoint=True)[slow]
        work = 0 if self.cfg.deadline_policy == "drop" else done * per_unit[slow]
        budget[slow] = np.minimum(budget[slow], work)
        return slow
