"""Config rules shared by the algorithms' ``check_config``: combinations that cannot be faithful.

Each algorithm states in its own ``check_config`` *why* it refuses a local optimiser or IMA; these
helpers only turn that reason into the one-line :class:`ConfigError` (exit 2) every bad config
gets. The full decision matrix (algorithm × local optimiser × weighting × IMA) is in
``configs/README.md`` under "Option combinations".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rayfl.schema import ConfigError


def reject_adam(name: str, cfg: Any, why: str) -> None:
    """ConfigError when ``local.optimizer`` is adam: ``name`` needs SGD steps because ``why``."""
    if cfg.local.optimizer == "adam":
        raise ConfigError("local.optimizer", "adam", f"sgd with {name} ({why})")


def require_plain_sgd(name: str, cfg: Any, why: str) -> None:
    """ConfigError when a ``local.*`` optimiser setting would be silently ignored: ``name``
    takes plain SGD steps of its own because ``why``."""
    for key, value, plain in (("local.optimizer", cfg.local.optimizer, "sgd"),
                              ("local.momentum", cfg.local.momentum, 0.0),
                              ("local.weight_decay", cfg.local.weight_decay, 0.0),
                              ("local.clip_norm", cfg.local.clip_norm, None)):
        if value != plain:
            raise ConfigError(key, value, f"{plain} with {name} ({why})")


def effective_weighting(cls: Any, cfg: Any) -> str:
    """What ``aggregation.weighting`` means for ``cls``: ``auto`` is uniform under ``privacy``
    (DP-FedAvg's fixed-denominator estimator) and the algorithm's paper weighting otherwise."""
    weighting = cfg.aggregation.weighting
    if weighting != "auto":
        return weighting
    return "uniform" if cfg.privacy is not None else cls.paper_weighting


def check_buffers(cfg: Any, module: Any) -> None:
    """ConfigError when ``module`` holds buffers (BatchNorm statistics) that the run could not
    carry faithfully: the algorithm's math has no place for them, privacy would release them
    un-noised, a wrapper such as IMA would pair averaged parameters with one round's
    statistics, or the event-driven modes would mix statistics of models of different ages."""
    from rayfl.models.flat import persistent_buffers

    if not persistent_buffers(module):
        return
    from rayfl.algorithms import registry
    from rayfl.algorithms.wrapper import wrapper_classes

    why = registry.get(cfg.algorithm.name).buffers_reason
    refused = [
        (why is not None, f"with {cfg.algorithm.name} ({why})"),
        (cfg.privacy is not None, "with a privacy section (the statistics are client data "
                                  "and would be averaged without clipping or noise)"),
        *((True, f"with wrapper {cls.name} ({cls.model_buffers_reason})")
          for _, cls, _ in wrapper_classes(cfg) if cls.model_buffers_reason),
        (cfg.aggregation.mode != "sync", f"with aggregation.mode {cfg.aggregation.mode} "
                                         "(statistics of models of different ages)"),
    ]
    for hit, reason in refused:
        if hit:
            raise ConfigError("model.name", cfg.model.name,
                              f"a model without buffers (BatchNorm statistics: use GroupNorm or "
                              f"no normalisation) {reason}")


def check_model(cfg: Any, module: Any, handle: Any) -> None:
    """ConfigError when the algorithm names a parameter group ``module`` does not have
    (FedPer's personal layers, FedBN's normalisation layers) or needs data the partition behind
    ``handle`` lacks (FedProto's one class per row)."""
    from rayfl.algorithms import registry
    from rayfl.models.flat import Layout

    registry.get(cfg.algorithm.name).check_model(cfg.algorithm.params, Layout.of(module), handle)
