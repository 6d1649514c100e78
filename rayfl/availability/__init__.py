"""Availability models: who is online, who is sampled, who finishes (see :func:`make_sampler`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayfl.availability.base import AvailabilityModel, Context, RoundPlan
from rayfl.availability.config import AvailabilityConfig
from rayfl.availability.devices import _read_capacity
from rayfl.availability.labels import LabelStats
from rayfl.availability.sampler import Sampler
from rayfl.availability.trace import Trace
from rayfl.contract import calling, name_of
from rayfl.runtime.local import LocalSpec


def make_sampler(cfg: AvailabilityConfig, handle, clients_per_round: int, seed: int, spec,
                 model_bytes: int = 0, poisson_rate: float | None = None,
                 upload_bytes: float | None = None, selection=None) -> Sampler:
    """The round planner for ``cfg``: call ``.plan(t, now)`` once per round (``.plan(t, now,
    losses)`` when the ``selection`` section's selector ``scores_candidates``).

    ``handle`` is the run's :class:`~rayfl.data.DataHandle` (client sizes, labels via
    ``handle.open()``); ``spec`` the :class:`~rayfl.runtime.local.LocalSpec` (K_i per client);
    ``model_bytes`` the size of the model sent down and up (0: transfers take no time);
    ``upload_bytes`` what a client sends up when it differs (compressed updates).
    """
    stats = LabelStats(handle)
    ctx = Context(handle.num_clients, seed, handle.num_classes, stats, cfg.correlate)
    cls = cfg.component()
    with calling(name_of(cls, "__init__")):  # a user's model: its own errors name it
        model = cls.build(cfg, ctx)
    return Sampler(cfg, model, stats, handle.sizes(), clients_per_round, seed, spec, model_bytes,
                   poisson_rate, upload_bytes, selection)


@dataclass(frozen=True)
class Sampling:
    """What a run's round planner is made of (:func:`rayfl.assemble.sampling` reads it from
    the run's sections, once): the ``availability`` and ``selection`` sections, clients a
    round, the seed, each client's steps, and whether clients are sampled by Poisson (the
    privacy mechanism's sampling)."""

    availability: AvailabilityConfig
    selection: Any  # rayfl.selection.config.SelectionConfig
    per_round: int
    seed: int
    spec: LocalSpec
    poisson: bool


def run_sampler(sampling: Sampling, handle, stack, w) -> Sampler:
    """The run's round planner, the same for the server and the pre-flight: ``stack`` its
    layers (what a client uploads), ``w`` the model's flat parameters (what is sent down)."""
    s, size = sampling, w.element_size()
    return make_sampler(
        s.availability, handle, s.per_round, s.seed, s.spec, model_bytes=w.numel() * size,
        poisson_rate=s.per_round / handle.num_clients if s.poisson else None,
        upload_bytes=stack.upload_bytes(w.numel(), size) if stack.layers else None,
        selection=s.selection)


def check_files(cfg: AvailabilityConfig, num_clients: int) -> None:
    """Read the trace and capacity files the way a run will (a ConfigError naming a bad one),
    so that a broken file stops the run before anything starts."""
    if cfg.model == "trace":
        Trace(cfg.trace_path, num_clients)
    if cfg.capacity_path is not None:
        _read_capacity(cfg.capacity_path)


__all__ = ["AvailabilityConfig", "AvailabilityModel", "Context", "RoundPlan", "Sampler",
           "Sampling", "check_files", "make_sampler"]
