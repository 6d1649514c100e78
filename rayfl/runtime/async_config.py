"""What FedBuff and FedAsync accept, and their resolved ``aggregation`` settings.

:func:`check_config` refuses, naming the key and the reason, every combination the event-driven
modes cannot honour; :class:`Settings` holds the keys the event loop
(:mod:`rayfl.runtime.async_loop`) reads, and the staleness weight s(τ).
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl.schema import ConfigError


def staleness_weight(kind: str, tau: int, a: float = 0.5, b: int = 4) -> float:
    """s(τ): ``constant`` 1; ``polynomial`` (1 + τ)^−a; ``hinge`` 1 for τ ≤ b, else
    1 / (a (τ − b) + 1) (Xie et al. 2019, FedAsync)."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + tau) ** -a)
    return 1.0 if tau <= b else 1.0 / (a * (tau - b) + 1.0)


def check_config(cls, cfg) -> None:
    """Refuse what the event-driven modes cannot honour, naming the key and the reason."""
    from rayfl.algorithms import registry
    from rayfl.algorithms.wrapper import wrapper_classes

    mode = cfg.aggregation.mode
    name = cls.name or cfg.algorithm.name
    if not cls.asynchronous_ok:
        ok = ", ".join(n for n in registry.names() if registry.get(n).asynchronous_ok)
        raise ConfigError("aggregation.mode", mode,
                          f"sync with {name} ({cls.synchronous_reason}; algorithms "
                          f"defined asynchronously: {ok})")
    if callable(getattr(cls, "client_settle", None)):
        raise ConfigError("aggregation.mode", mode,
                          f"sync with {name} (its client_settle reads "
                          "the aggregate of the round a client trained in; a client's update "
                          "here joins a later server step)")
    av = cfg.availability
    refused = [  # (key, value, refused when, expected)
        *((f"{where}.name", cls.name, True, f"no {cls.name} wrapper ({cls.async_reason})")
          for where, cls, _ in wrapper_classes(cfg) if cls.async_reason),
        ("privacy", "(set)", cfg.privacy is not None,
         "no privacy section (the accountant assumes uniformly sampled synchronous rounds)"),
        ("availability.deadline_s", av.deadline_s, av.deadline_s is not None,
         "null (a round deadline has no meaning without rounds)"),
        ("availability.stragglers", av.stragglers, av.stragglers > 0,
         "0 (device speeds already make clients late; stragglers cut a synchronous round)"),
        ("availability.overcommit", av.overcommit, av.overcommit != 1.0,
         "1 (slots are refilled as clients arrive; nothing to over-commit)"),
        ("availability.interval_s", av.interval_s, av.interval_s != 0.0,
         "0 (the server never idles between rounds)"),
        ("selection.name", cfg.selection.name, cfg.selection.name != "uniform",
         "uniform (a freed slot is refilled at once; there is no round of candidates to "
         "score)"),
        ("data.regime", cfg.data.regime, cfg.data.regime is not None,
         "null (the drift regimes re-split a synchronous round's data)"),
        ("keep.rounds", cfg.keep.rounds, bool(cfg.keep.rounds),
         "empty (kept rounds are synchronous rounds)"),
        ("keep.last", cfg.keep.last, cfg.keep.last > 0,
         "0 (kept rounds are synchronous rounds)"),
    ]
    for key, value, bad, expected in refused:
        if bad:
            raise ConfigError(key, value, f"{expected} with aggregation.mode {mode}")
    _check_secagg(cfg)
    trainable = cfg.data.num_clients - cfg.data.validation_clients
    concurrency = cfg.aggregation.concurrency or cfg.clients_per_round
    if concurrency > trainable:
        raise ConfigError("aggregation.concurrency", concurrency,
                          f"at most data.num_clients - data.validation_clients = {trainable}")


def _check_secagg(cfg) -> None:
    """Secure aggregation reveals only a sum: FedAsync's sum of one update reveals that update
    (and its mixing step needs it decoded); FedBuff cannot weight each update by its staleness."""
    from rayfl.transforms import entries_of

    ag = cfg.aggregation
    for where, entry in entries_of(cfg):
        if entry["name"] != "secagg":
            continue
        if ag.mode == "fedasync":
            raise ConfigError(f"{where}.name", "secagg",
                              "no secagg with aggregation.mode fedasync (a sum of one update "
                              "reveals it, and the mixing step needs it decoded)")
        if ag.staleness != "constant":
            raise ConfigError("aggregation.staleness", ag.staleness,
                              f"constant with {where} = secagg in aggregation.mode {ag.mode} "
                              "(the server sees only the sum and cannot weight each update "
                              "by its staleness)")


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
    def from_config(cls, cfg) -> Settings:
        ag = cfg.aggregation
        return cls(ag.mode, ag.concurrency or cfg.clients_per_round,
                   1 if ag.mode == "fedasync" else ag.buffer_size or cfg.clients_per_round,
                   ag.staleness, ag.staleness_a, ag.staleness_b, ag.max_staleness, ag.mixing)

    def weight(self, tau: int) -> float:
        return staleness_weight(self.staleness, tau, self.a, self.b)
