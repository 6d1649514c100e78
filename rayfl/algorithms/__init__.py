"""Federated algorithms in flat-vector form; :mod:`registry` maps config names to classes."""

from __future__ import annotations

from rayfl.algorithms.base import Algorithm


def build(cfg, num_clients: int) -> Algorithm:
    """The configured algorithm (wrapped in IMA when ``cfg.ima`` is set)."""
    from rayfl.algorithms import registry

    cls = registry.get(cfg.algorithm.name)
    # heavy-ball momentum is what SCAFFOLD's and FedNova's step normaliser must know; Adam has none
    momentum = cfg.local.momentum if cfg.local.optimizer == "sgd" else 0.0
    weighting = cfg.aggregation.weighting
    if weighting == "auto":
        weighting = cls.paper_weighting
    algo = cls(cfg.algorithm.params, weighting=weighting,
               num_clients=num_clients, rounds=cfg.rounds, local_momentum=momentum)
    if cfg.ima is not None:
        from rayfl.algorithms.ima import wrap_ima

        algo = wrap_ima(algo, cfg.ima, cfg.rounds)
    return algo
