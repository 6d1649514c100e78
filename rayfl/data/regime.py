"""FedEve's drift regimes: each round, re-split the sampled clients' pooled rows among them.

``period_only`` re-splits the pool iid (the round's union still shifts: period drift, no client
drift); ``client_only`` re-splits it with Dirichlet(α) label skew (client drift, no period drift
when the stored partition is iid). Every client keeps its own size n_i, so the server's weights
and step budgets stay true. ``iid`` and ``both`` train on the stored partition unchanged.
"""

from __future__ import annotations

import numpy as np

from rayfl.rng import REGIME, stream

from rayfl.data import partition as part
from rayfl.schema import ConfigError

RESPLIT = ("period_only", "client_only")


def check_regime(cfg, handle) -> None:
    """ConfigError when ``data.regime`` re-splits by label and the labels are per position."""
    if cfg.regime == "client_only" and handle.label_len:
        raise ConfigError("data.regime", cfg.regime,
                          "iid, period_only or both for a dataset with one label per position "
                          "(next-token prediction): client_only re-splits with label skew, "
                          "which needs one label per row")


def regime_rows(reader, regime: str | None, sampled_ids, t: int, seed: int,
                alpha: float | None = None) -> dict[int, np.ndarray]:
    """client id -> indices into ``reader.x``/``reader.y`` it trains on in round ``t``.

    Deterministic from (seed, t, the sampled set); every actor computing it for the same round
    gets the same answer, whichever of the clients it trains. ``alpha`` defaults to the
    store's ``data.alpha``.
    """
    ids = np.unique(np.asarray(sampled_ids, dtype=np.int64))
    lo = np.asarray(reader.offsets[ids], dtype=np.int64)
    sizes = np.asarray(reader.offsets[ids + 1], dtype=np.int64) - lo
    ends = np.cumsum(sizes)
    pool = np.repeat(lo - (ends - sizes), sizes) + np.arange(int(ends[-1]) if len(ids) else 0)
    if regime in RESPLIT:
        rng = stream(seed, t, REGIME)
        if regime == "period_only":
            pool = pool[rng.permutation(len(pool))]
        else:
            a = reader.handle.cfg.alpha if alpha is None else alpha
            order, _ = part.label_dirichlet(np.asarray(reader.y[pool]), sizes, a, rng)
            pool = pool[order]
    return {int(i): rows for i, rows in zip(ids, np.split(pool, ends[:-1]))}


class RoundData:
    """What each client of round ``t`` trains on: its own rows, or under a re-splitting regime
    its share of the round's pooled rows. Built once per round and process by
    :meth:`~rayfl.data.DataReader.round`; the runtime only asks :meth:`client`."""

    def __init__(self, reader, t: int, round_clients):
        cfg = reader.handle.cfg
        regime = cfg.regime if cfg is not None else None
        self.reader = reader
        self.rows = regime_rows(reader, regime, round_clients, t, reader.handle.seed) \
            if regime in RESPLIT and round_clients is not None else None

    def client(self, c: int):
        """Client ``c``'s raw inputs and labels for this round."""
        return self.reader.client(c) if self.rows is None else self.reader.rows(self.rows[c])
