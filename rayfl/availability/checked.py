"""An availability model's contract, checked on every call: who is online is a mask.

``online(t, now)`` returns None (everyone) or a mask of exactly N booleans, one per client;
``online_at(clients, times)`` None or one boolean per client asked about. Ids instead of a mask,
a short mask or 0/1 integers would silently change who is ever online, so each is refused as one
:class:`~rayfl.contract.ComponentError` naming ``module:Name.method`` and the round; so is an
exception the model raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rayfl.contract import ComponentError, calling, describe, name_of


class CheckedAvailability:
    """``model`` with its contract checked at each call; every other attribute is the model's
    own."""

    def __init__(self, model: Any, num_clients: int):
        self.inner, self.num_clients = model, num_clients
        self.round: int | None = None  # the round of the last ``online`` call

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def online(self, t: int, now: float) -> np.ndarray | None:
        """Who is online at virtual time ``now`` of round ``t`` (None: everyone), checked."""
        self.round = t
        name = name_of(self.inner, "online")
        with calling(name, round=t):
            mask = self.inner.online(t, now)
        return checked_mask(mask, self.num_clients, "clients", name, t)

    def online_at(self, clients: np.ndarray, times: np.ndarray) -> np.ndarray | None:
        """Whether each of ``clients`` is online at its ``times`` (None: all stay), checked."""
        name = name_of(self.inner, "online_at")
        with calling(name, round=self.round):
            mask = self.inner.online_at(clients, times)
        return checked_mask(mask, len(clients), "clients asked about", name, self.round)


def checked_mask(mask: Any, size: int, what: str, component: str,
                 t: int | None) -> np.ndarray | None:
    """``mask`` when it is None or ``size`` booleans (a list becomes an array); a
    ComponentError saying what is wrong otherwise."""
    if mask is None:
        return None
    arr = mask if isinstance(mask, np.ndarray) else \
        np.asarray(mask) if isinstance(mask, (list, tuple)) else None
    if arr is None or arr.dtype != bool:
        hint = "; ids? mark them instead: mask = np.zeros(N, bool); mask[ids] = True" \
            if arr is not None and np.issubdtype(arr.dtype, np.integer) else ""
        raise ComponentError(component, f"returned {describe(mask)}; expected None or a boolean "
                             f"mask with one entry per client (True: online){hint}", t)
    if arr.shape != (size,):
        raise ComponentError(component, f"returned a mask of shape {arr.shape}; expected "
                             f"exactly {size} booleans, one for each of the {size} {what}", t)
    return arr
