"""``algorithm.*``, ``ima.*`` and ``server_opt.*``: the algorithm, IMA around it and the server
optimiser replacing its step (see ``rayfl.algorithms``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional

from rayfl import registry
from rayfl.schema import field


@dataclass(frozen=True)
class AlgorithmConfig(registry.Named):
    """The algorithm and its hyper-parameters (every other key is the algorithm's own)."""

    KIND = "algorithm"

    name: str = field("fedavg", doc="algorithm: a built-in (see `rayfl algorithms`) or "
                                    "package.module:Name, an Algorithm subclass")
    params: Any = field(None, doc="validated hyper-parameters of the chosen algorithm",
                        flatten=True)


@dataclass(frozen=True)
class IMAConfig:
    """Iterative moving averaging (seed 004) around the chosen server algorithm."""

    window: int = field(5, doc="P: number of recent global models averaged", lo=1)
    start: float = field(0.75, doc="t_s as a fraction of rounds (<1) or a round index (>=1)",
                         lo=0.0)
    decay_after: float = field(0.97, doc="per-round local lr decay from t_s on", lo=0.0, hi=1.0,
                               lo_open=True)
    reset_server_moments: bool = field(True, doc="zero FedAdam/Yogi moments at t_s")


@dataclass(frozen=True)
class ServerOptConfig:
    """A server optimizer for the algorithm's server step (algorithms that accept one)."""

    name: Literal["sgd", "momentum", "adam", "yogi", "adagrad"] = field(
        "sgd", doc="x ← x − step: sgd, momentum, adam, yogi or adagrad (Reddi et al. 2021)")
    lr: Optional[float] = field(None, doc="server lr (null: algorithm.server_lr)", lo=0.0,
                                lo_open=True)
    momentum: float = field(0.9, doc="β of momentum", lo=0.0, hi=1.0, hi_open=True)
    nesterov: bool = field(False, doc="Nesterov form of momentum")
    beta1: float = field(0.9, doc="first-moment decay β1 (adam, yogi, adagrad)", lo=0.0,
                         hi=1.0, hi_open=True)
    beta2: float = field(0.99, doc="second-moment decay β2 (adam, yogi)", lo=0.0, hi=1.0,
                         hi_open=True)
    tau: float = field(1e-3, doc="adaptivity τ added to √v", lo=0.0, lo_open=True)
    v_init: Optional[float] = field(None, doc="initial second moment (null: τ²)", lo=0.0)
