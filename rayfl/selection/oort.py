"""Oort (Lai, Zhu, Madhyastha & Chowdhury, OSDI 2021, "Oort: Efficient Federated Learning via
Guided Participant Selection"), Algorithm 1 on the virtual clock.

A client i explored before (it completed a round) has the statistical utility of its last round
    U_i = |B_i| · L̄_i
(|B_i| its training samples; L̄_i the mean training loss it reported, standing in for the paper's
root-mean-square per-sample loss, which rayfl's clients do not report). At round R its score is
    util_i = Ũ_i + sqrt(0.1 · log R / L_i)          (L_i: the last round i took part in)
    util_i ← util_i · (T / t_i)^α   when t_i > T    (t_i: its virtual round duration)
with Ũ the utilities min-max normalised over the online explored clients, as the authors' code
does so that the uncertainty bonus is on the same scale. Of the m clients sampled,
⌊(1 − ε)·m⌋ are exploited: those whose score reaches ``cutoff`` × the ⌊(1 − ε)·m⌋-th highest
score, sampled with probability ∝ score; the rest explore unexplored online clients, the
``explore_window`` × (their count) with the largest |B_i| · (T / t_i)^α (size and speed),
sampled ∝ that. ε decays by ``exploration_decay`` a round from ``exploration`` to
``exploration_min``. The preferred duration T is the ``threshold``-th percentile of the clients'
round durations; the pacer raises it by ``pacer_delta`` points every ``pacer_window`` rounds in
which the exploited utility fell below that of the window before (Algorithm 1: T ← T + Δ).
Defaults are the paper's and FedScale's (ε 0.9 → 0.2 by ×0.98, α = 2, c = 0.95, W = 20).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rayfl import schema
from rayfl.selection.base import Selector, SelectorTraits


@dataclass(frozen=True)
class OortParams:
    """Oort keys."""

    exploration: float = schema.field(0.9, doc="ε at round 1: the share of each round's clients "
                                               "that explore unexplored clients", lo=0.0, hi=1.0)
    exploration_decay: float = schema.field(0.98, doc="ε ← ε · decay after every round",
                                            lo=0.0, hi=1.0, lo_open=True)
    exploration_min: float = schema.field(0.2, doc="the floor of ε", lo=0.0, hi=1.0)
    cutoff: float = schema.field(0.95, doc="c: exploited clients are drawn among those scoring "
                                           "≥ c × the ⌊(1 − ε)m⌋-th highest score", lo=0.0,
                                 hi=1.0, lo_open=True)
    penalty: float = schema.field(2.0, doc="α: a client slower than T has its score × "
                                           "(T / t_i)^α", lo=0.0)
    threshold: float = schema.field(30.0, doc="T at the start: this percentile of the clients' "
                                              "round durations (100: no penalty)", lo=0.0,
                                    hi=100.0)
    pacer_window: int = schema.field(20, doc="W: rounds between pacer decisions", lo=1)
    pacer_delta: float = schema.field(5.0, doc="Δ: percentile points T rises by when the "
                                               "exploited utility of the last W rounds fell",
                                      lo=0.0, hi=100.0)
    explore_window: float = schema.field(5.0, doc="unexplored clients are drawn among this "
                                                  "many times as many as are needed, the "
                                                  "largest and fastest", lo=1.0)


class Oort(Selector):
    """Utility-guided selection with exploration, a straggler penalty and a pacer."""

    name = "oort"
    Params = OortParams

    #: the tuner's preset ``oort``: Oort selects, with its exploration share ε, straggler
    #: penalty α and cut-off c searched
    traits = SelectorTraits(search_space={
        "selection.name": {"type": "categorical", "choices": ["oort"]},
        "selection.exploration": {"low": 0.2, "high": 0.9},
        "selection.penalty": {"low": 0.5, "high": 4.0},
        "selection.cutoff": {"low": 0.8, "high": 1.0}})

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.utility: dict[int, float] = {}  # explored client -> |B_i| · L̄_i
        self.last: dict[int, int] = {}  # explored client -> last round taken part in (from 1)
        self.threshold = params.threshold
        self.history: list[float] = []  # the exploited score of each round
        self._durations: np.ndarray | None = None

    def durations(self) -> np.ndarray:
        """Every client's virtual round duration (fixed per client: its device and K_i)."""
        if self._durations is None:
            self._durations = self.ctx.duration(np.arange(len(self.ctx.sizes)))
        return self._durations

    def preferred(self) -> float:
        """T: the ``threshold``-th percentile of the round durations (inf at 100)."""
        if self.threshold >= 100.0:
            return math.inf
        return float(np.percentile(self.durations(), self.threshold, method="lower"))

    def penalised(self, scores: np.ndarray, ids: np.ndarray, limit: float) -> np.ndarray:
        t_i = self.durations()[ids]
        slow = t_i > limit
        out = scores.astype(np.float64).copy()
        out[slow] *= (limit / t_i[slow]) ** self.p.penalty
        return out

    def select(self, t, rng, online, m, losses):
        p, r = self.p, t + 1
        epsilon = max(p.exploration * p.exploration_decay ** t, p.exploration_min)
        limit = self.preferred()
        seen = np.fromiter((i in self.utility for i in online.tolist()), bool, len(online))
        explored, unexplored = online[seen], online[~seen]
        n_exploit = min(int(m * (1 - epsilon)), len(explored))
        n_explore = min(m - n_exploit, len(unexplored))
        n_exploit = min(m - n_explore, len(explored))  # too few unexplored: exploit more
        picked = []
        if n_exploit:
            scores = self.scores(explored, r, limit)
            order = np.argsort(-scores, kind="stable")
            admitted = order[scores[order] >= p.cutoff * scores[order[n_exploit - 1]]]
            chosen = _draw(rng, admitted, scores[admitted], n_exploit)
            self.history = [*self.history, float(scores[chosen].sum())][-2 * p.pacer_window:]
            picked.append(explored[chosen])
        if n_explore:
            prior = self.penalised(self.ctx.sizes[unexplored], unexplored, limit)
            window = min(len(unexplored), math.ceil(p.explore_window * n_explore))
            top = np.argsort(-prior, kind="stable")[:window]
            picked.append(unexplored[_draw(rng, top, prior[top], n_explore)])
        self._pace(r)
        return np.concatenate(picked) if picked else online[:0]

    def scores(self, ids: np.ndarray, r: int, limit: float) -> np.ndarray:
        """util_i of the explored clients ``ids`` at round ``r``."""
        u = np.array([self.utility[i] for i in ids.tolist()])
        span = u.max() - u.min()
        norm = (u - u.min()) / span if span > 0 else np.zeros_like(u)
        last = np.array([self.last[i] for i in ids.tolist()], dtype=np.float64)
        return self.penalised(norm + np.sqrt(0.1 * math.log(r) / last), ids, limit)

    def _pace(self, r: int) -> None:
        """Algorithm 1's pacer: relax T when the exploited utility fell over the last window."""
        w = self.p.pacer_window
        if r % w or len(self.history) < 2 * w:
            return
        if sum(self.history[-w:]) < sum(self.history[-2 * w:-w]):
            self.threshold = min(100.0, self.threshold + self.p.pacer_delta)

    def observe(self, t, losses):
        for client, loss in losses.items():  # a client that took no step has no loss: 0
            loss = float(loss) if math.isfinite(loss) else 0.0
            self.utility[client] = float(self.ctx.sizes[client]) * loss
            self.last[client] = t + 1

    def state(self):
        ids = np.array(sorted(self.utility), dtype=np.int64)
        return {"ids": ids, "utility": np.array([self.utility[i] for i in ids.tolist()]),
                "last": np.array([self.last[i] for i in ids.tolist()], dtype=np.int64),
                "threshold": self.threshold, "history": list(self.history)}

    def load_state(self, state):
        if state is None:
            return
        ids = state["ids"].tolist()
        self.utility = dict(zip(ids, state["utility"].tolist()))
        self.last = dict(zip(ids, state["last"].tolist()))
        self.threshold, self.history = state["threshold"], list(state["history"])


def _draw(rng: np.random.Generator, among: np.ndarray, weight: np.ndarray, k: int) -> np.ndarray:
    """``k`` of ``among`` without replacement, with probability ∝ ``weight`` (a weight of 0
    still drawable once the positive ones run out)."""
    w = np.maximum(weight.astype(np.float64), 1e-12)
    return rng.choice(among, k, replace=False, p=w / w.sum())
