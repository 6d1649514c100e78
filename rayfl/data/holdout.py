"""Per-client held-out rows (``data.client_holdout``): each training client keeps a random part
of its own rows out of training, for per-client evaluation (:mod:`rayfl.metrics.client_eval`).

Carved once, when the partition store is written: client i holds back k_i = ⌊h·n_i⌋ of its n_i
rows (at most n_i − 1, so it still trains; validation clients hold back none), chosen by a
generator keyed by the seed alone. With h = 0 nothing is carved and the store is byte-for-byte
the one written without the option. Vectorised: no Python object per client.
"""

from __future__ import annotations

import numpy as np

from rayfl.rng import HOLDOUT, stream



def holdout_counts(sizes: np.ndarray, num_train: int, fraction: float) -> np.ndarray:
    """k_i = min(⌊fraction·n_i⌋, n_i − 1) for the first ``num_train`` clients, 0 after them."""
    sizes = np.asarray(sizes, dtype=np.int64)
    k = np.minimum(np.floor(fraction * sizes).astype(np.int64), np.maximum(sizes - 1, 0))
    k[num_train:] = 0
    return k


def carve(order: np.ndarray, offsets: np.ndarray, num_train: int, fraction: float,
          seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split every client's rows ``order[offsets[i]:offsets[i+1]]`` into training and held-out.

    Returns ``(train_order, train_offsets, holdout_order, holdout_offsets)``; both keep the rows
    of a client in their stored order, and client i's held-out rows are the k_i of its rows
    with the smallest keys of a uniform draw keyed by ``(seed, HOLDOUT)``.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    k = holdout_counts(sizes, num_train, fraction)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    keys = stream(seed, HOLDOUT).random(len(owner))
    by_key = np.lexsort((keys, owner))  # rows grouped by client, each client's by key
    rank = np.empty(len(owner), dtype=np.int64)
    rank[by_key] = np.arange(len(owner)) - offsets[owner[by_key]]
    held = rank < k[owner]
    order = np.asarray(order)
    return (order[~held], np.r_[0, np.cumsum(sizes - k)].astype(np.int64),
            order[held], np.r_[0, np.cumsum(k)].astype(np.int64))
