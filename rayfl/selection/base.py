"""The selector interface: which of the online clients a synchronous round samples.

A selector is built once per run as ``cls(params, ctx)`` and asked each round for ``m`` of the
online clients; it may learn from what the clients report after training (:meth:`observe`)
and then carries state, which the server checkpoints (:meth:`state` / :meth:`load_state`), so a
resumed or forked run selects exactly as the uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np


@dataclass(frozen=True)
class SelectionContext:
    """What a selector may build itself from."""

    sizes: np.ndarray  # training samples of each of the N clients
    seed: int
    duration: Callable[[np.ndarray], np.ndarray]  # clients -> virtual seconds of a full round


@dataclass(frozen=True)
class SelectorTraits:
    """What a selector declares besides its keys: the tuner's preset (dotted run-config key ->
    parameter spec; its keys pick the selector too)."""

    search_space: dict = field(default_factory=dict)


class Selector:
    """Uniform selection (the default); subclasses override :meth:`select`. A selector that
    sets ``scores_candidates`` receives ``losses`` (client ids -> training loss at the round's
    start model, computed on the client actors) in :meth:`select`."""

    name: ClassVar[str] = "uniform"
    Params: ClassVar[Any] = None
    scores_candidates: ClassVar[bool] = False
    traits: ClassVar[SelectorTraits] = SelectorTraits()

    def __init__(self, params: Any, ctx: SelectionContext):
        self.p, self.ctx = params, ctx

    def select(self, t: int, rng: np.random.Generator, online: np.ndarray, m: int,
               losses: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
        """``m`` distinct ids of ``online`` (ascending ids of the online clients) for round
        ``t``; every random draw from ``rng`` (keyed by the run's seed and ``t``).

        The contract, checked at every call (``rayfl/selection/checked.py``): exactly ``m``
        integer ids (a 1-d integer array or a list of ints; float ids are refused, not
        rounded), each one of ``online``, none twice; no id only when ``m`` is 0, which is when
        no client is online. A broken one stops the run with one line naming this method."""
        return rng.choice(online, m, replace=False)

    def observe(self, t: int, losses: dict[int, float]) -> None:
        """Round ``t``'s completed clients and the mean training loss each reported."""

    def state(self) -> Any:
        """What :meth:`observe` learnt (None: nothing), for the checkpoint: tensors, arrays,
        numbers, strings, None, and lists, tuples or str-keyed dicts of them (checked)."""
        return None

    def load_state(self, state: Any) -> None:
        """Restore :meth:`state` from a checkpoint."""

    @classmethod
    def reads_reports(cls) -> bool:
        """Whether it sees what clients report of their data: the losses it scores candidates
        by (``scores_candidates``) or those :meth:`observe` receives (overridden)."""
        return cls.scores_candidates or cls.observe is not Selector.observe

    @classmethod
    def check_config(cls, params: Any, cfg: Any, where: str) -> None:
        """A ConfigError (on ``where``'s keys) for settings this selector cannot honour
        (default: none)."""
