"""Federated algorithms in flat-vector form; :mod:`registry` maps config names to classes."""

from __future__ import annotations

from rayfl.algorithms.base import Algorithm


def build(cfg, num_clients: int) -> Algorithm:
    """The configured algorithm (with its ``server_opt``), inside the configured ``wrappers``."""
    from rayfl.algorithms import registry, server_opt
    from rayfl.algorithms.checks import effective_weighting

    cls = registry.get(cfg.algorithm.name)
    # heavy-ball momentum is what SCAFFOLD's and FedNova's step normaliser must know; Adam has none
    momentum = cfg.local.momentum if cfg.local.optimizer == "sgd" else 0.0
    weighting = effective_weighting(cls, cfg)
    opt = None
    if cfg.server_opt is not None:
        o = cfg.server_opt
        lr = cfg.algorithm.params.server_lr if o.lr is None else o.lr
        opt = server_opt.build(o.name, lr, o.momentum, o.nesterov, o.beta1, o.beta2, o.tau,
                               o.v_init)
    algo = cls(cfg.algorithm.params, weighting=weighting, num_clients=num_clients,
               local_momentum=momentum, server_opt=opt)
    from rayfl.algorithms.wrapper import wrap

    return wrap(algo, cfg)
