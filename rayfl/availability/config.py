"""``availability.*``: who is online each round, system heterogeneity and the virtual clock."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from rayfl import registry
from rayfl.schema import ConfigError, field

TRACE_SUFFIXES = (".pkl", ".pickle", ".csv", ".parquet")


@dataclass(frozen=True)
class AvailabilityConfig(registry.Named):
    """Client availability model, stragglers and the virtual clock (see ``rayfl.availability``)."""

    KIND = "availability"
    NAME_FIELD = "model"

    model: str = field(
        "always", doc="who is online: a built-in (listed under `availability.model` below) or "
                      "package.module:Name, an AvailabilityModel subclass; mid-round failures "
                      "are `dropout`, on top of any model")
    mean: float = field(0.5, doc="bernoulli: mean online probability over clients; diurnal: "
                                 "daily mean online probability", lo=0.0, hi=1.0, lo_open=True)
    spread: float = field(0.1, doc="bernoulli: standard deviation of the per-client online "
                                   "probability (Beta distributed; 0 = all equal)", lo=0.0)
    correlate: Literal["none", "label"] = field(
        "none", doc="bernoulli/diurnal: tie availability to data: label ranks clients' online "
                    "probability (bernoulli) or picks their time zone (diurnal) by dominant "
                    "label, which creates period drift on purpose")
    zones: int = field(24, doc="diurnal: time zones, evenly spread over the day (at most one "
                              "a minute)", lo=1, hi=1440)
    peak_hour: float = field(2.0, doc="diurnal: local hour of peak availability (devices idle "
                                      "and charging at night)", lo=0.0, hi=24.0, hi_open=True)
    amplitude: float = field(0.8, doc="diurnal: relative swing of the daily curve: p(h) = mean"
                                      "·(1 + amplitude·cos(2π(h − peak_hour)/24))",
                             lo=0.0, hi=1.0)
    trace_path: str | None = field(
        None, doc="trace: FedScale client_behave_trace pickle (.pkl/.pickle) or a table "
                  "(.csv/.parquet) with columns client_id, online_start, online_end (seconds); "
                  "replay loops when the run outlasts the trace")
    dropout: float = field(0.0, doc="probability that a sampled client fails mid-round and "
                                    "returns nothing (applies to every model)",
                           lo=0.0, hi=1.0, hi_open=True)
    overcommit: float = field(1.0, doc="sample ceil(clients_per_round × overcommit) and keep "
                                       "the first clients_per_round to finish (FedScale)", lo=1.0)
    deadline_s: float | None = field(None, doc="virtual round deadline in seconds (null: "
                                                  "wait for every kept client)",
                                        lo=0.0, lo_open=True)
    deadline_policy: Literal["drop", "partial"] = field(
        "drop", doc="a client cut by the deadline or made a straggler: drop (returns nothing; "
                    "FedProx's FedAvg baseline) or partial (returns the local steps it "
                    "finished, as in FedNova and FedProx)")
    stragglers: float = field(0.0, doc="FedProx's systems heterogeneity: this fraction of each "
                                       "round's clients, drawn at random, has time for only a "
                                       "uniform whole number of epochs in 1..E−1 (of steps in "
                                       "1..K−1 with local.steps); deadline_policy then drops "
                                       "or keeps their work", lo=0.0, hi=1.0)
    interval_s: float = field(0.0, doc="virtual seconds the server idles between rounds "
                                       "(pacing); added to every round's duration", lo=0.0)
    speed_mean: float = field(0.005, doc="mean compute time in seconds per training sample "
                                         "(log-normal over clients)", lo=0.0, lo_open=True)
    speed_sigma: float = field(0.6, doc="log-normal σ of per-client compute time (0 = "
                                        "identical devices)", lo=0.0)
    bandwidth_mean: float = field(5.0, doc="mean client bandwidth in Mbit/s, up and down "
                                           "(log-normal over clients)", lo=0.0, lo_open=True)
    bandwidth_sigma: float = field(0.5, doc="log-normal σ of per-client bandwidth", lo=0.0)
    capacity_path: str | None = field(
        None, doc="FedScale client_device_capacity pickle {id: {computation: ms per sample "
                  "(inference; training costs 3×, as FedScale), communication: kbps}}; "
                  "replaces speed_* and bandwidth_*")
    max_empty_rounds: int = field(
        10, doc="stop the run when this many rounds in a row complete no client (nobody "
                "online, every sampled client dropped out, went offline or missed deadline_s), "
                "or when every round of a shorter run did: the run ends with the reason in "
                "summary.json (stopped) and exit status 4 instead of reporting done on the "
                "initial model; each such round is counted (empty_rounds) and says why "
                "(empty_reason)", lo=1)
    params: Any = field(None, doc="validated Params of the chosen availability model",
                        flatten=True)

    def check(self, prefix: str) -> None:
        """Rules of the section itself; each model's own rules are its ``check_section``."""
        if self.capacity_path is not None:
            check_file(f"{prefix}.capacity_path", self.capacity_path, (".pkl", ".pickle"))


def check_file(key: str, path: str, suffixes: tuple[str, ...]) -> None:
    if not path.lower().endswith(suffixes):
        raise ConfigError(key, path, "a file ending in " + ", ".join(suffixes))
    if not os.path.isfile(path):
        raise ConfigError(key, path, "an existing file")
