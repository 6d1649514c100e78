"""``trace``: replay recorded availability (FedScale ``client_behave_trace`` or a plain table).

A trace is a set of online intervals per trace client, held as three flat arrays. Client i of
the run replays trace client ``i mod M`` (trace clients in sorted id order), and the trace loops
when the run outlasts it, as FedScale does: a FedScale client with period ``finish_time`` is
online at time t iff ``active[k] ≤ t mod finish_time ≤ inactive[k]`` for some k; a table loops
with the period ``max(online_end)``. As in FedScale, a client must also be online when it
reports: one offline by then is lost (:meth:`Trace.online_at`).
"""

from __future__ import annotations

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from rayfl import safe_pickle
from rayfl.availability.base import READ_ERRORS, AvailabilityModel, one_line
from rayfl.availability.config import TRACE_SUFFIXES, check_file
from rayfl.schema import ConfigError

KEY = "availability.trace_path"
PICKLE_FORMAT = ("a FedScale client_behave_trace pickle: {client_id: {'active': [start, ...], "
                 "'inactive': [end, ...], 'finish_time': period > 0}}")
TABLE_FORMAT = ("a table with columns client_id, online_start, online_end (seconds, "
                "online_end ≥ online_start, some online_end > 0)")


class Trace(AvailabilityModel):
    """Online intervals ``[start[j], end[j]]`` of trace client ``owner[j]``; ``period`` is one
    number (a table) or one per trace client (FedScale)."""

    def __init__(self, path: str, n: int):
        if path.lower().endswith((".pkl", ".pickle")):
            self.start, self.end, self.owner, self.period, self.clients = _read_pickle(path)
        else:
            self.start, self.end, self.owner, self.period, self.clients = _read_table(path)
        self.n = n
        by_owner = np.argsort(self.owner, kind="stable")  # intervals of each trace client
        self.intervals = np.split(by_owner, np.cumsum(np.bincount(self.owner,
                                                                  minlength=self.clients))[:-1])

    @staticmethod
    def check_section(cfg, prefix: str) -> None:
        """``trace_path`` names an existing trace file."""
        if cfg.trace_path is None:
            raise ConfigError(f"{prefix}.trace_path", None, "a trace file when "
                              f"{prefix}.model is 'trace'")
        check_file(f"{prefix}.trace_path", cfg.trace_path, TRACE_SUFFIXES)

    @classmethod
    def build(cls, cfg, ctx) -> "Trace":
        return cls(cfg.trace_path, ctx.num_clients)

    def online(self, t: int, now: float) -> np.ndarray:
        x = now % self.period
        if np.ndim(x):
            x = x[self.owner]
        hit = (self.start <= x) & (x <= self.end)
        on = np.zeros(self.clients, dtype=bool)
        on[self.owner[hit]] = True
        return np.resize(on, self.n)

    def online_at(self, clients: np.ndarray, times: np.ndarray) -> np.ndarray:
        owner = np.asarray(clients) % self.clients
        x = np.asarray(times, dtype=np.float64) % (
            self.period[owner] if np.ndim(self.period) else self.period)
        return np.array([bool(((self.start[j] <= xi) & (xi <= self.end[j])).any())
                         for j, xi in zip((self.intervals[k] for k in owner), x)], dtype=bool)


def _read_pickle(path: str):
    try:
        with open(path, "rb") as f:
            raw = safe_pickle.load(f)
        ids = sorted(raw)
        active = [np.asarray(raw[k]["active"], dtype=np.float64).ravel() for k in ids]
        inactive = [np.asarray(raw[k]["inactive"], dtype=np.float64).ravel() for k in ids]
        period = np.array([float(raw[k]["finish_time"]) for k in ids])
    except READ_ERRORS as e:  # unreadable or not the documented shape: say which and why
        raise ConfigError(KEY, path, f"{PICKLE_FORMAT} ({one_line(e)})") from None
    lens = np.array([len(a) for a in active])
    if not ids or any(len(a) != len(b) for a, b in zip(active, inactive)) or \
            not (period > 0).all() or not np.isfinite(period).all():
        raise ConfigError(KEY, path, PICKLE_FORMAT + " with as many 'inactive' as 'active' "
                          "entries per client")
    start, end = np.concatenate(active), np.concatenate(inactive)
    if not (np.isfinite(start).all() and np.isfinite(end).all()) or (end < start).any() or \
            not len(start):
        raise ConfigError(KEY, path, PICKLE_FORMAT + " whose intervals are finite, each "
                          "'inactive' ≥ its 'active', and some client is ever online")
    owner = np.repeat(np.arange(len(ids), dtype=np.int32), lens)
    return start, end, owner, period, len(ids)


def _read_table(path: str):
    try:
        table = pq.read_table(path) if path.lower().endswith(".parquet") else \
            pacsv.read_csv(path)
        ids = table.column("client_id").to_numpy()
        start = table.column("online_start").to_numpy().astype(np.float64)
        end = table.column("online_end").to_numpy().astype(np.float64)
    except READ_ERRORS as e:
        raise ConfigError(KEY, path, f"{TABLE_FORMAT} ({one_line(e)})") from None
    if len(ids) == 0 or not (np.isfinite(start).all() and np.isfinite(end).all()) or \
            (end < start).any() or end.max() <= 0:
        raise ConfigError(KEY, path, TABLE_FORMAT + ", all finite")
    uniq, owner = np.unique(ids, return_inverse=True)
    return start, end, owner.astype(np.int32), float(end.max()), len(uniq)
