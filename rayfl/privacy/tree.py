"""DP-FTRL's tree aggregation (Kairouz, McMahan, Song, Thakkar, Thakurta & Xu, ICML 2021,
"Practical and Private (Deep) Learning without Sampling or Shuffling"): noise for prefix sums.

The rounds t = 0, 1, … are the leaves of a binary tree (a fresh tree every ``restart`` rounds
when restarts are on). Node ν = (level h, index i) of a tree covers its rounds
[i·2^h, (i + 1)·2^h) and is released once the last of them has passed, as its sum plus noise:

    s̃_ν = Σ_{τ∈ν} g_τ + z_ν,     z_ν ~ N(0, σ² I), drawn from a generator keyed by
                                  (seed, tree, h, i), so every node's noise can be regenerated.

The tree's prefix sum Σ_{τ≤t} g_τ is estimated from the maximal complete nodes D(t) that tile
[0, t] (the binary digits of t + 1, at most ⌈log₂(t + 2)⌉ of them): s̃_{≤t} = Σ_{ν∈D(t)} s̃_ν,
whose noise is n_t = Σ_{ν∈D(t)} z_ν. Round t's sum receives n_t − n_{t−1} (n_{−1} = 0; after a
restart the previous tree's last prefix noise stays in the model), so the server step
x_{t+1} = x_t − η ĝ_t telescopes to DP-FTRL's iterate x_0 − η s̃_{≤t} (no regulariser) and the
noise of consecutive rounds is correlated. The state is the values of D(t): O(log t) vectors.

Honaker's estimator (Honaker 2015; Kairouz et al., Appendix B.1) replaces each completed node by
the minimum-variance unbiased combination of its own value and its children's estimates,
bottom-up:

    ŝ_ν = w_h s̃_ν + (1 − w_h)(ŝ_left + ŝ_right),   v_0 = σ²,
    v_h = (1/σ² + 1/(2 v_{h−1}))⁻¹,   w_h = v_h / σ²,

the best linear unbiased estimate of the node's sum from its subtree; the prefix estimate sums
the estimates of D(t) (variance Σ v_h instead of |D(t)| σ²). It post-processes the same
releases, so ε does not change.

Privacy (Kairouz et al., Appendix D): a client taking part in the rounds π adds a contribution of
norm ≤ S to every node that contains one of them. The tree's entries are nonnegative, so the
L2 sensitivity of all releases is S·sqrt(Σ_ν |π ∩ ν|²) over the complete nodes ν;
:func:`max_sensitivity_squared` bounds its maximum over the participation schema (at most k
rounds, consecutive ones at least b apart), :func:`sensitivity_squared` gives it for the rounds
a client actually took part in.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from rayfl import rng



def honaker_weights(levels: int) -> np.ndarray:
    """w_h for h = 0..levels−1 at unit node variance: the weight of a node's own value."""
    w, v = np.ones(levels), 1.0
    for h in range(1, levels):
        v = 1.0 / (1.0 + 1.0 / (2.0 * v))
        w[h] = v
    return w


class TreeNoise:
    """Round-by-round noise of the tree mechanism at unit σ (the caller scales it).

    :meth:`round_noise` must be called for rounds 0, 1, 2, … in order; :meth:`state` holds the
    stack of D(t) (levels and values), which is all the mechanism needs to continue.
    """

    def __init__(self, seed: int, restart: int | None = None, honaker: bool = False):
        self.seed, self.restart, self.honaker = seed, restart, honaker
        self.next_round = 0
        self.levels: list[int] = []  # of the nodes of D(next_round − 1), left to right
        self.values: list[np.ndarray] = []
        self._weights = honaker_weights(64)

    def node(self, tree: int, level: int, index: int, dim: int) -> np.ndarray:
        """z_ν of node (tree, level, index): standard normal, regenerable from the seed."""
        return rng.stream(self.seed, rng.TREE_NODES, tree, level, index).standard_normal(dim)

    def prefix(self, dim: int) -> np.ndarray:
        """n_{t} of the current tree after the last round (zeros before its first round)."""
        out = np.zeros(dim)
        for v in self.values:
            out += v
        return out

    def round_noise(self, t: int, dim: int) -> np.ndarray:
        """n_t − n_{t−1}: what round ``t``'s sum receives."""
        if t != self.next_round:
            raise ValueError(f"tree noise for round {t} after round {self.next_round - 1}")
        tree, leaf = (0, t) if self.restart is None else divmod(t, self.restart)
        if leaf == 0:
            self.levels, self.values = [], []
        before = self.prefix(dim)
        self.levels.append(0)
        self.values.append(self.node(tree, 0, leaf, dim))
        while len(self.levels) >= 2 and self.levels[-1] == self.levels[-2]:
            h = self.levels.pop() + 1
            right, left = self.values.pop(), self.values.pop()
            self.levels[-1] = h
            own = self.node(tree, h, leaf >> h, dim)
            w = self._weights[h] if self.honaker else 1.0
            self.values.append(own if w == 1.0 else w * own + (1.0 - w) * (left + right))
        self.next_round = t + 1
        return self.prefix(dim) - before

    def fresh_state(self) -> dict:
        """The :meth:`state` before round 0."""
        return {"next_round": 0, "levels": [], "values": []}

    def state(self) -> dict:
        """The stack of D(t) and the next round (plain data for the checkpoint)."""
        return {"next_round": self.next_round, "levels": list(self.levels),
                "values": list(self.values)}

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state`."""
        self.next_round = int(state["next_round"])
        self.levels = [int(h) for h in state["levels"]]
        self.values = [np.asarray(v, dtype=np.float64) for v in state["values"]]


def complete_nodes(horizon: int, restart: int | None = None) -> list[tuple[int, int, int, int]]:
    """(tree, level, start, end) of every node released within the first ``horizon`` rounds,
    with start/end as global round indices (end exclusive)."""
    size = horizon if restart is None else restart
    out = []
    for first in range(0, horizon, max(size, 1)):
        leaves = min(size, horizon - first)
        h = 0
        while 2 ** h <= leaves:
            for i in range(leaves // 2 ** h):
                out.append((first // max(size, 1), h, first + i * 2 ** h,
                            first + (i + 1) * 2 ** h))
            h += 1
    return out


def sensitivity_squared(rounds: np.ndarray, horizon: int, restart: int | None = None) -> int:
    """Σ_ν |π ∩ ν|² over the nodes complete within ``horizon`` for one client's rounds π."""
    rounds = np.asarray(rounds, dtype=np.int64)
    rounds = rounds[rounds < horizon]
    size = horizon if restart is None else restart
    tree, leaf = rounds // size, rounds % size
    leaves_in_tree = np.minimum(size, horizon - tree * size)
    total, h = 0, 0
    while 2 ** h <= size:
        index = leaf >> h
        complete = (index + 1) * 2 ** h <= leaves_in_tree
        _, counts = np.unique(np.stack([tree[complete], index[complete]]), axis=1,
                              return_counts=True)
        total += int((counts.astype(np.int64) ** 2).sum())
        h += 1
    return total


def _max_plus(a: np.ndarray, b: np.ndarray, limit: int) -> np.ndarray:
    """c[m] = max_{i+j=m} a[i] + b[j] for m ≤ limit."""
    out = np.full(min(len(a) + len(b) - 1, limit + 1), -np.inf)
    for i, left in enumerate(a[:len(out)]):
        if left > -np.inf:
            span = min(len(b), len(out) - i)
            out[i:i + span] = np.maximum(out[i:i + span], left + b[:span])
    return out


@cache
def _subtree(level: int, leaves: int, separation: int, limit: int) -> tuple[float, ...]:
    """Best Σ_ν |π ∩ ν|² over the complete nodes of a node of ``level`` whose first ``leaves``
    rounds exist, for m = 0.. participations (index m), each node of L existing rounds holding
    at most ⌈L / b⌉ of them."""
    cap = min(limit, math.ceil(leaves / separation))
    if level == 0:
        return (0.0, 1.0)[:cap + 1]
    half = 2 ** (level - 1)
    left = np.array(_subtree(level - 1, min(leaves, half), separation, limit))
    right = np.array(_subtree(level - 1, max(leaves - half, 0), separation, limit))
    best = _max_plus(left, right, cap)
    if leaves == 2 ** level:  # the node itself is released
        best = best + np.arange(len(best)) ** 2.0
    return tuple(best)


def _tree_best(leaves: int, separation: int, limit: int) -> np.ndarray:
    level = max(leaves - 1, 0).bit_length()
    return np.array(_subtree(level, leaves, separation, limit))


def max_sensitivity_squared(horizon: int, min_separation: int,
                            max_participations: int | None = None,
                            restart: int | None = None) -> float:
    """An upper bound on max_π Σ_ν |π ∩ ν|² over the participation schema within ``horizon``
    rounds: at most k rounds (``max_participations``; None: no bound but the separation),
    consecutive ones at least b = ``min_separation`` apart.

    Recursion over the tree (Xu et al. 2023's dynamic programme, in the form of Kairouz et al.'s
    Appendix D): a node adds m² for its m participations and splits them between its children,
    a node of L rounds holding at most ⌈L / b⌉; the separation across a node boundary is relaxed
    to that cap, so the value is ≥ the true maximum. Trees after restarts are independent; the
    best spread of k over them takes whole trees at capacity and at most one partly (the per-tree
    values are convex in m), checked by an exact allocation when they are not."""
    if horizon <= 0:
        return 0.0
    k = math.ceil(horizon / min_separation) if max_participations is None else \
        min(max_participations, math.ceil(horizon / min_separation))
    size = horizon if restart is None else min(restart, horizon)
    full, rest = divmod(horizon, size)
    per_tree = _tree_best(size, min_separation, k)
    last = _tree_best(rest, min_separation, k) if rest else np.zeros(1)
    if full == 1:
        return float(_max_plus(per_tree, last, k).max())
    if np.all(np.diff(per_tree, 2) >= 0):  # convex: whole trees at capacity, one in part
        cap = len(per_tree) - 1
        best = -np.inf
        for m_last in range(min(len(last) - 1, k) + 1):
            left = k - m_last
            whole = min(full, left // cap) if cap else 0
            value = last[m_last] + whole * per_tree[cap]
            if whole < full:
                value += per_tree[min(left - whole * cap, cap)]
            best = max(best, value)
        return float(best)
    total = np.zeros(1)
    for _ in range(full):
        total = _max_plus(total, per_tree, k)
    return float(_max_plus(total, last, k).max())


def depth(steps: int) -> int:
    """⌈log₂(steps + 1)⌉: the most complete nodes one round of a ``steps``-round tree is in."""
    return math.ceil(math.log2(steps + 1))
