"""The participation schema of DP-FTRL and banded MF, enforced by the server and recorded.

Their guarantee rests on a bound on how often a client takes part, not on uniform sampling: at
least b rounds between two participations of a client (``min_separation``) and at most k in all
(``max_participations``). Before every round the server removes from the online clients those
within b rounds of their last participation or with k already (:meth:`Participation.eligible`),
whatever the availability model or selector; after it, the clients whose update entered the sum
are recorded (:meth:`Participation.record`). The record is server state (checkpointed, resumed,
forked) and ends as ``participation.parquet`` in the run directory, one row per client that took
part: its rounds (1-based) and its individual ε.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

NEVER = np.iinfo(np.int64).min // 2  # "last round" of a client that never took part
FILE = "participation.parquet"
STATE = ("sizes", "clients")  # the entries of its checkpointed state (:meth:`Participation.state`)


@dataclass(frozen=True)
class Schema:
    """b: rounds between two participations of a client (1: none required); k: participations
    of a client in all (None: as many as b and the rounds allow)."""

    min_separation: int = 1
    max_participations: int | None = None

    def bound(self, horizon: int) -> int:
        """The most participations one client can have in ``horizon`` rounds."""
        most = -(-horizon // self.min_separation)
        return most if self.max_participations is None else min(most, self.max_participations)


class Participation:
    """Each client's rounds so far; the eligibility filter of the schema."""

    def __init__(self, num_clients: int, schema: Schema):
        self.schema = schema
        self.last = np.full(num_clients, NEVER, dtype=np.int64)
        self.count = np.zeros(num_clients, dtype=np.int64)
        self.rounds: list[np.ndarray] = []  # the clients recorded in each round, by round

    def eligible(self, t: int) -> np.ndarray:
        """Mask of the clients round ``t`` may take: ≥ b rounds since their last, < k so far."""
        ok = t - self.last >= self.schema.min_separation
        if self.schema.max_participations is not None:
            ok &= self.count < self.schema.max_participations
        return ok

    def record(self, t: int, clients: np.ndarray) -> None:
        """Round ``t``'s participants (their updates entered the sum)."""
        if t != len(self.rounds):
            raise ValueError(f"participation of round {t} recorded after {len(self.rounds)} "
                             "rounds")
        clients = np.asarray(clients, dtype=np.int64)
        self.rounds.append(clients.copy())
        self.last[clients] = t
        self.count[clients] += 1

    def state(self) -> dict:
        """Every round's participants, flattened (plain data for the checkpoint)."""
        sizes = np.array([len(r) for r in self.rounds], dtype=np.int64)
        flat = np.concatenate(self.rounds) if self.rounds else np.zeros(0, dtype=np.int64)
        return dict(zip(STATE, (sizes, flat)))

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state`."""
        self.last[:] = NEVER
        self.count[:] = 0
        self.rounds = []
        bounds = np.cumsum(np.concatenate([[0], np.asarray(state["sizes"], dtype=np.int64)]))
        clients = np.asarray(state["clients"], dtype=np.int64)
        for t in range(len(bounds) - 1):
            self.record(t, clients[bounds[t]:bounds[t + 1]])

    def by_client(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(the clients that took part, ascending; each one's rounds, 0-based ascending)."""
        if not self.rounds:
            return np.zeros(0, dtype=np.int64), []
        clients = np.concatenate(self.rounds)
        rounds = np.repeat(np.arange(len(self.rounds)), [len(r) for r in self.rounds])
        order = np.lexsort((rounds, clients))
        clients, rounds = clients[order], rounds[order]
        ids, starts = np.unique(clients, return_index=True)
        return ids, np.split(rounds, starts[1:])

    def write(self, run_dir: str, epsilons: np.ndarray) -> str:
        """``participation.parquet``: client, participations, rounds (1-based), epsilon (each
        client's individual ε, in the order of :meth:`by_client`)."""
        ids, rounds = self.by_client()
        table = pa.table({
            "client": pa.array(ids, pa.int64()),
            "participations": pa.array([len(r) for r in rounds], pa.int32()),
            "rounds": pa.array([(r + 1).tolist() for r in rounds], pa.list_(pa.int32())),
            "epsilon": pa.array(np.asarray(epsilons, dtype=np.float64), pa.float64())})
        path = os.path.join(run_dir, FILE)
        pq.write_table(table, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path
