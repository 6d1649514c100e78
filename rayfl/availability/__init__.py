"""Availability models: who is online, who is sampled, who finishes (see :func:`make_sampler`)."""

from __future__ import annotations

from rayfl.availability.always import AlwaysOn
from rayfl.availability.base import RoundPlan
from rayfl.availability.bernoulli import Bernoulli
from rayfl.availability.config import AvailabilityConfig
from rayfl.availability.diurnal import Diurnal
from rayfl.availability.labels import LabelStats, label_ranks
from rayfl.availability.sampler import Sampler
from rayfl.availability.trace import Trace


def make_sampler(cfg: AvailabilityConfig, handle, clients_per_round: int, seed: int, spec,
                 model_bytes: int = 0, poisson_rate: float | None = None) -> Sampler:
    """The round planner for ``cfg``: call ``.plan(t, now)`` once per round.

    ``handle`` is the run's :class:`~rayfl.data.DataHandle` (client sizes, labels via
    ``handle.open()``); ``spec`` the :class:`~rayfl.runtime.local.LocalSpec` (K_i per client);
    ``model_bytes`` the size of the model sent down and up (0: transfers take no time).
    """
    stats = LabelStats(handle)
    n = handle.num_clients
    by_label = cfg.correlate == "label" and cfg.model in ("bernoulli", "diurnal")
    ranks = label_ranks(stats, seed) if by_label else None
    if cfg.model == "bernoulli":
        model = Bernoulli(cfg, n, seed, ranks)
    elif cfg.model == "diurnal":
        model = Diurnal(cfg, n, seed, ranks, handle.num_classes)
    elif cfg.model == "trace":
        model = Trace(cfg.trace_path, n)
    else:
        model = AlwaysOn()
    return Sampler(cfg, model, stats, handle.sizes(), clients_per_round, seed, spec, model_bytes,
                   poisson_rate)


__all__ = ["AvailabilityConfig", "RoundPlan", "Sampler", "make_sampler"]
