"""Round plans (what the server dispatches, with how much work) and random-stream keys."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rayfl.rng import LABEL_RANK, stream


@dataclass
class RoundPlan:
    """The server's plan for one round, decided before any client trains.

    ``clients`` are dispatched (sorted ascending). ``step_budget[i]`` caps client
    ``clients[i]``'s local steps (a straggler cut by the deadline that keeps its partial work);
    ``None`` means every client runs its full K_i. ``dropped`` were sampled but return nothing
    (failed mid-round, cut by the deadline, or the over-committed surplus that finished late).
    """

    clients: np.ndarray
    step_budget: np.ndarray | None = None
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    duration: float = 0.0  # virtual seconds of the round
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Context:
    """What an availability model may build itself from (see :class:`AvailabilityModel`)."""

    num_clients: int  # N training clients (ids 0..N-1)
    seed: int
    num_classes: int
    stats: Any  # LabelStats of the partition (per-client label counts)
    correlate: str = "none"  # availability.correlate

    def ranks(self) -> np.ndarray | None:
        """Clients ranked by dominant label when ``availability.correlate: label``, else None."""
        if self.correlate != "label":
            return None
        perm = stream(self.seed, LABEL_RANK).permutation(self.stats.num_classes)
        return perm[self.stats.dominant()].astype(np.int32)  # dominant label, seeded relabel


class AvailabilityModel:
    """Who is online: ``online(t, now)`` is a boolean mask over the N clients at virtual time
    ``now`` of round ``t`` (None: everyone). A user model subclasses this, may declare ``Params``
    (its ``availability.*`` keys) and is built as ``cls(params, ctx)``; built-ins override
    :meth:`build` to read their keys from the section."""

    def __init__(self, params: Any, ctx: Context):
        self.params, self.ctx = params, ctx

    @classmethod
    def build(cls, cfg: Any, ctx: Context) -> "AvailabilityModel":
        """The model for the ``availability`` section ``cfg``."""
        return cls(cfg.params, ctx)

    def online(self, t: int, now: float) -> np.ndarray | None:
        """Who is online at virtual time ``now`` of round ``t``: None (everyone) or a mask of
        exactly N booleans (a list or array; ids or 0/1 integers are refused, see
        ``rayfl/availability/checked.py``)."""
        return None

    def online_at(self, clients: np.ndarray, times: np.ndarray) -> np.ndarray | None:
        """Whether each of ``clients`` is online at its own virtual time ``times[i]`` (when it
        would report; FedScale counts a client offline by then as lost): one boolean per client
        asked about. None: a client online when it is dispatched stays online until it reports
        (models that decide per round)."""
        return None



# What reading a malformed trace or capacity file (pickle, CSV, Parquet) can raise.
READ_ERRORS = (OSError, EOFError, ImportError, pickle.UnpicklingError, KeyError, IndexError,
               TypeError, ValueError, AttributeError, NotImplementedError)


def one_line(e: BaseException) -> str:
    """``Type: message`` of a read error on one line, at most 200 characters of message."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
