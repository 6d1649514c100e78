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
                 model_bytes: int = 0) -> Sampler:
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
    return Sampler(cfg, model, stats, handle.sizes(), clients_per_round, seed, spec, model_bytes)


def check_files(cfg: AvailabilityConfig, num_clients: int) -> None:
    """Read the trace and capacity files the way a run will (a ConfigError naming a bad one),
    so that a broken file stops the run before anything starts."""
    from rayfl.availability.devices import _read_capacity

    if cfg.model == "trace":
        Trace(cfg.trace_path, num_clients)
    if cfg.capacity_path is not None:
        _read_capacity(cfg.capacity_path)


__all__ = ["AvailabilityConfig", "RoundPlan", "Sampler", "check_files", "make_sampler"]
