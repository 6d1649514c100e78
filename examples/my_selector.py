"""A client selector of your own: the online clients that have taken part least so far.

Run it: ``rayfl run configs/test/tiny.yaml selection.name=examples.my_selector:LeastSeen``.
What ``observe`` learns is returned by ``state`` and checkpointed, so a resumed run selects as
the uninterrupted one would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rayfl.schema import field
from rayfl.selection import Selector


@dataclass(frozen=True)
class LeastSeenParams:
    jitter: float = field(0.0, doc="random tie-breaking noise added to the counts", lo=0.0)


class LeastSeen(Selector):
    """Fewest past rounds first (ties: random)."""

    Params = LeastSeenParams

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        self.rounds = np.zeros(len(ctx.sizes), dtype=np.int64)

    def select(self, t, rng, online, m, losses):
        score = self.rounds[online] + self.p.jitter * rng.random(len(online))
        return online[np.lexsort((rng.random(len(online)), score))[:m]]

    def observe(self, t, losses):
        self.rounds[list(losses)] += 1

    def state(self):
        return {"rounds": self.rounds}

    def load_state(self, state):
        if state is not None:
            self.rounds = state["rounds"].copy()
