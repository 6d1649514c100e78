"""What the algorithms need of the rest of a run beyond their traits: the weighting ``auto``
resolves to, and the model's parameter groups (checked once the model is built).

What an algorithm refuses (a local optimiser, a wrapper, privacy, buffers) is declared in its
traits and checked by :mod:`rayfl.compat`; the full decision matrix is in ``configs/README.md``
under "Option combinations".
"""

from __future__ import annotations

from typing import Any

from rayfl.algorithms import registry
from rayfl.models.flat import Layout


def effective_weighting(cls: Any, weighting: str, privacy: Any) -> str:
    """What ``aggregation.weighting`` (``weighting``) means for ``cls``: ``auto`` is uniform
    under a ``privacy`` section (DP-FedAvg's fixed-denominator estimator) and the algorithm's
    paper weighting otherwise."""
    if weighting != "auto":
        return weighting
    return "uniform" if privacy is not None else cls.traits.weighting


def check_model(cfg: Any, module: Any, handle: Any) -> None:
    """ConfigError when the algorithm names a parameter group ``module`` does not have
    (FedPer's personal layers, FedBN's normalisation layers) or needs data the partition behind
    ``handle`` lacks (FedProto's one class per row)."""
    registry.get(cfg.algorithm.name).check_model(cfg.algorithm.params, Layout.of(module), handle)
