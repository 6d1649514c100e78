"""Round plans (what the server dispatches, with how much work) and random-stream keys."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import numpy as np


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


# Purpose keys: every draw comes from np.random.default_rng([seed, (round,) PURPOSE]).
SAMPLE = 0x5A4D  # which online clients are sampled
ONLINE = 0x0A71  # per-round online coin flips (bernoulli, diurnal)
DROPOUT = 0xD209  # mid-round failures
PROPENSITY = 0xBE7A  # per-client online probabilities (bernoulli)
ZONE = 0x2011E  # time-zone assignment (diurnal)
LABEL_RANK = 0x1ABE  # order of labels when availability follows data
DEVICE = 0xDE71  # compute speed and bandwidth per client

# What reading a malformed trace or capacity file (pickle, CSV, Parquet) can raise.
READ_ERRORS = (OSError, EOFError, ImportError, pickle.UnpicklingError, KeyError, IndexError,
               TypeError, ValueError, AttributeError, NotImplementedError)
