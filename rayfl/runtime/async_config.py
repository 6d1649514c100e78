"""FedBuff's and FedAsync's resolved ``aggregation`` settings.

:class:`Settings` holds the keys the event loop (:mod:`rayfl.runtime.async_loop`) reads, and the
staleness weight s(τ); what the event-driven modes refuse is in :mod:`rayfl.compat`.
"""

from __future__ import annotations

from dataclasses import dataclass



def staleness_weight(kind: str, tau: int, a: float = 0.5, b: int = 4) -> float:
    """s(τ): ``constant`` 1; ``polynomial`` (1 + τ)^−a; ``hinge`` 1 for τ ≤ b, else
    1 / (a (τ − b) + 1) (Xie et al. 2019, FedAsync)."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + tau) ** -a)
    return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


@dataclass
class Settings:
    """The ``aggregation`` keys of an event-driven run, resolved."""

    mode: str  # fedbuff | fedasync
    concurrency: int
    buffer_size: int
    staleness: str = "polynomial"
    a: float = 0.5
    b: int = 4
    max_staleness: int | None = None
    mixing: float = 0.6

    @classmethod
    def of(cls, ag, clients_per_round: int) -> Settings:
        """The settings of an ``aggregation`` section (null sizes: ``clients_per_round``)."""
        return cls(ag.mode, ag.concurrency or clients_per_round,
                   1 if ag.mode == "fedasync" else ag.buffer_size or clients_per_round,
                   ag.staleness, ag.staleness_a, ag.staleness_b, ag.max_staleness, ag.mixing)

    def weight(self, tau: int) -> float:
        return staleness_weight(self.staleness, tau, self.a, self.b)
