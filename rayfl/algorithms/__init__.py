"""Federated algorithms in flat-vector form; :mod:`registry` maps config names to classes."""

from __future__ import annotations

from rayfl.algorithms.base import Algorithm


def build(cfg, num_clients: int) -> Algorithm:
    """The configured algorithm (wrapped in IMA when ``cfg.ima`` is set)."""
    from rayfl.algorithms import registry

    cls = registry.get(cfg.algorithm.name)
    algo = cls(cfg.algorithm.params, weighting=cfg.aggregation.weighting,
               num_clients=num_clients, rounds=cfg.rounds)
    if cfg.ima is not None:
        from rayfl.algorithms.ima import wrap_ima

        algo = wrap_ima(algo, cfg.ima, cfg.rounds)
    return algo
