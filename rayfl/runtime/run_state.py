"""A run's state between two rounds, one typed record: everything a checkpoint holds.

The server writes a :class:`RunState` at each checkpoint — the server state tree, the client
state versions, the previous round's mean update, the virtual clock, the time run so far, the
event loop's snapshot, the selector's and the participation record's state — and a resume or a
fork reads one back with :func:`restored`, every piece checked against what the run expects
(:class:`Expected`; the tree by structure against the run's layers), so a checkpoint that does
not fit the run is a :class:`~rayfl.runtime.storage.CheckpointError` naming the piece and what
was expected, before any of it is used. The file holds the record's fields under their names,
as rayfl 0.1 and 0.2 wrote them (those files resume).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rayfl.privacy import bounds_participation
from rayfl.privacy.participation import STATE as PARTICIPATION
from rayfl.runtime.async_loop import SNAPSHOT
from rayfl.runtime.checkpoint import server_state
from rayfl.runtime.storage import CheckpointError

#: the config key that decides whether a piece exists (what a mismatch names)
DECIDED_BY = {"asynchronous": "aggregation.mode", "participation": "privacy.mechanism"}


@dataclass
class RunState:
    """Everything a run carries from round ``round`` (the last one done) to the next."""

    round: int
    state: Any  # rayfl.layers.ServerState: the model and one slot per layer
    versions: np.ndarray  # each client's state version (−1: it holds none)
    prev_delta: torch.Tensor | None  # the last round's mean update (for the drift metrics)
    virtual_time: float  # the virtual clock, seconds
    elapsed: float  # wall-clock seconds run so far, over every resume
    asynchronous: dict | None  # the event loop's snapshot (None: synchronous rounds)
    selection: Any  # the selector's own state (its load_state reads it)
    participation: dict | None  # every round's participants (None: no bound to keep)

    def payload(self) -> dict:
        """The checkpoint's entries: each field under its name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class Expected:
    """What a run's checkpoint holds: the model x (its length and dtype, as the run's model
    makes it), a version per client, the event loop's snapshot (None: synchronous rounds), the
    participation record (None: no bound kept)."""

    x: tuple[int, torch.dtype]
    clients: int
    asynchronous: tuple[str, ...] | None
    participation: tuple[str, ...] | None


def expected(aggregation, privacy, num_clients: int, x: tuple[int, torch.dtype]) -> Expected:
    """The pieces of a checkpoint of a run with these ``aggregation`` and ``privacy`` sections
    over ``num_clients`` clients, whose model is a vector of ``x`` = (length, dtype)."""
    return Expected(x, num_clients, None if aggregation.mode == "sync" else SNAPSHOT,
                    PARTICIPATION if bounds_participation(privacy) else None)


def restored(ck: dict, expect: Expected, where: str, stack=None) -> RunState:
    """The checkpoint ``ck`` (as read, from ``where``) as a :class:`RunState`, each piece
    checked against what the run expects, the server state tree against the run's ``stack``
    (None: ``ck`` holds the tree rebuilt already); a :class:`CheckpointError` naming ``where``
    and the first piece that does not fit. A resume's or a fork's pre-flight calls it before
    anything starts, the server again when it continues."""
    def fail(piece: str, wanted: str, found: Any) -> CheckpointError:
        decided = f", as {DECIDED_BY[piece]} decides" if piece in DECIDED_BY else ""
        return CheckpointError(where, f"a checkpoint of this run ({piece}: expected {wanted}"
                                      f"{decided}; found {_kind(found)})")

    round_ = ck.get("round")
    if not _integer(round_) or round_ < 0:
        raise fail("round", "a round index ≥ 0", round_)
    state = ck["state"] if stack is None else server_state(stack, ck, where)
    size, dtype = expect.x
    if not (isinstance(state.x, torch.Tensor) and tuple(state.x.shape) == (size,)
            and state.x.dtype == dtype):
        raise fail("state.x", f"the model as a vector of {size} {dtype} parameters", state.x)
    versions = ck.get("versions")
    if not (isinstance(versions, np.ndarray) and versions.shape == (expect.clients,)
            and np.issubdtype(versions.dtype, np.integer)):
        raise fail("versions", f"one integer version per client ({expect.clients})", versions)
    prev = ck.get("prev_delta")
    if prev is not None and not (isinstance(prev, torch.Tensor) and prev.shape == state.x.shape):
        raise fail("prev_delta", f"nothing or a vector shaped like x {tuple(state.x.shape)}", prev)
    for piece in ("virtual_time", "elapsed"):
        if not _seconds(ck.get(piece)):
            raise fail(piece, "seconds ≥ 0", ck.get(piece))
    snap = ck.get("asynchronous")
    if not _entries(snap, expect.asynchronous):
        raise fail("asynchronous", "nothing (synchronous rounds)" if expect.asynchronous is None
                   else f"the event loop's snapshot ({', '.join(expect.asynchronous)})", snap)
    part = ck.get("participation") if expect.participation is not None else None  # 0.1: none
    if not _entries(part, expect.participation) or (part is not None and not (
            isinstance(part["sizes"], np.ndarray) and part["sizes"].shape == (round_ + 1,))):
        raise fail("participation", f"the participants of rounds 1–{round_ + 1}", part)
    return RunState(round_, state, versions, prev, float(ck["virtual_time"]),
                    float(ck["elapsed"]), snap, ck.get("selection"), part)


def _entries(value: Any, keys: tuple[str, ...] | None) -> bool:
    """Whether ``value`` is nothing where ``keys`` is None, else a dict of exactly ``keys``."""
    if keys is None:
        return value is None
    return isinstance(value, dict) and set(value) == set(keys)


def _integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value) and value >= 0


def _kind(value: Any) -> str:
    """What a piece was, in a few words."""
    if isinstance(value, str):
        return value
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"{type(value).__name__} of shape {tuple(value.shape)} ({value.dtype})"
    if isinstance(value, dict):
        return f"a dict of {', '.join(map(str, sorted(value, key=str))) or 'nothing'}"
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:120]
