"""A selector's contract, checked on every call: what comes back is the round's sample.

``select`` must return exactly ``m`` distinct client ids, integers, each one of the round's
online clients, as a 1-d integer array or a list of ints — no client repeated (it would train
and count as many times), no float id truncated into another client, none beyond the
population. It returns no id only when ``m`` is 0, which happens when no client is online. What
``state`` returns must fit in a checkpoint. A broken rule, or an exception the selector raises,
is one :class:`~rayfl.contract.ComponentError` naming ``module:Name.method`` and the round.
"""

from __future__ import annotations

from typing import Any, NoReturn

import numpy as np

from rayfl.contract import ComponentError, calling, describe, name_of
from rayfl.runtime.checkpoint_file import unencodable

SHOWN = 5  # offending ids quoted in a message


class CheckedSelector:
    """``selector`` with its contract checked at each call; every other attribute (its
    ``scores_candidates``, its own fields) is the selector's own."""

    def __init__(self, selector: Any, num_clients: int):
        self.inner, self.num_clients = selector, num_clients
        self.round: int | None = None  # the last round it was asked about

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def select(self, t: int, rng: np.random.Generator, online: np.ndarray, m: int,
               losses) -> np.ndarray:
        """The selector's ``m`` ids of ``online`` for round ``t``, checked (int64, in its order)."""
        self.round = t
        name = name_of(self.inner, "select")
        with calling(name, round=t):
            ids = self.inner.select(t, rng, online, m, losses)
        return checked_ids(ids, online, m, self.num_clients, name, t)

    def observe(self, t: int, losses: dict[int, float]) -> None:
        """Round ``t``'s completed clients and their losses, handed to the selector."""
        self.round = t
        with calling(name_of(self.inner, "observe"), round=t):
            self.inner.observe(t, losses)

    def state(self) -> Any:
        """The selector's state, checked to fit in a checkpoint."""
        name = name_of(self.inner, "state")
        with calling(name, round=self.round):
            value = self.inner.state()
        problem = unencodable(value)
        if problem is not None:
            raise ComponentError(name, f"returned {describe(value)}, which a checkpoint cannot "
                                 f"hold ({problem}); return tensors, arrays, numbers, strings, "
                                 "and lists, tuples or str-keyed dicts of them", self.round)
        return value

    def load_state(self, state: Any) -> None:
        """Restore the selector's checkpointed state."""
        with calling(name_of(self.inner, "load_state")):
            self.inner.load_state(state)


def checked_ids(ids: Any, online: np.ndarray, m: int, num_clients: int, component: str,
                t: int) -> np.ndarray:
    """``ids`` as an int64 array, in the order given, when they are ``m`` distinct integer ids
    of ``online`` (ascending) clients; a ComponentError saying what is wrong otherwise."""
    def fail(problem: str) -> NoReturn:
        raise ComponentError(component, problem, t)

    expected = "a 1-d integer array (or a list of ints) of client ids"
    if isinstance(ids, (list, tuple)):
        bad = next((i for i in ids if isinstance(i, (bool, np.bool_))
                    or not isinstance(i, (int, np.integer))), None)
        if bad is not None:
            fail(f"returned {describe(ids)} holding {describe(bad)} ({bad!r}); expected "
                 f"{expected}" + ("; float ids are not rounded to a client" if
                                  isinstance(bad, (float, np.floating)) else ""))
        values = [int(i) for i in ids]
        _check_range([i for i in values if i < 0], [i for i in values if i >= num_clients],
                     num_clients, fail)  # before int64 could overflow
        arr = np.array(values, dtype=np.int64)
    elif isinstance(ids, np.ndarray) and ids.ndim == 1 and (
            np.issubdtype(ids.dtype, np.integer) or ids.size == 0 and ids.dtype != object):
        arr = ids
        _check_range(arr[arr < 0], arr[arr >= num_clients], num_clients, fail)
    else:
        floats = isinstance(ids, np.ndarray) and np.issubdtype(ids.dtype, np.floating)
        fail(f"returned {describe(ids)}; expected {expected}" +
             ("; float ids are not rounded to a client" if floats else ""))
    unique, counts = np.unique(arr, return_counts=True)
    if len(unique) < len(arr):
        twice = unique[counts > 1]
        fail(f"returned client {int(twice[0])} {int(counts[counts > 1][0])} times "
             f"({len(twice)} ids repeated); each client at most once (a repeated client would "
             "train and be weighted that many times)")
    pos = np.minimum(np.searchsorted(online, unique), max(len(online) - 1, 0))
    offline = unique[(online[pos] != unique) if len(online) else np.ones(len(unique), bool)]
    if len(offline):
        fail(f"returned {len(offline)} clients that are offline in this round (e.g. "
             f"{_some(offline)}); choose among the `online` ids it is given")
    if len(arr) != m:
        if len(arr) == 0:
            fail(f"returned no client while {len(online)} are online; return m = {m} ids (none "
                 "only when no client is online)")
        fail(f"returned {len(arr)} ids, {'more' if len(arr) > m else 'fewer'} than the m = {m} "
             "asked for (m = min(⌈clients_per_round × availability.overcommit⌉, online "
             "clients))")
    return arr.astype(np.int64, copy=False)


def _check_range(negative, beyond, num_clients: int, fail) -> None:
    if len(negative):
        fail(f"returned negative ids ({_some(negative)}); client ids are 0..{num_clients - 1}")
    if len(beyond):
        fail(f"returned ids beyond the {num_clients} clients ({_some(beyond)}); client ids "
             f"are 0..{num_clients - 1}")


def _some(ids) -> str:
    shown = ", ".join(str(int(i)) for i in ids[:SHOWN])
    return shown + (", …" if len(ids) > SHOWN else "")
