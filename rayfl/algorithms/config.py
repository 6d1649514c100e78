"""``algorithm.*``, ``wrappers`` and ``server_opt.*``: the algorithm, the server wrappers around
it (:mod:`rayfl.algorithms.wrapper`) and the server optimiser replacing its step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

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
class WrapperConfig(registry.Named):
    """One entry of ``wrappers``: a server wrapper and its keys."""

    KIND = "wrapper"

    name: str = field(doc="server wrapper: a built-in (ima) or package.module:Name, a "
                          "ServerWrapper subclass")
    params: Any = field(None, doc="validated keys of the chosen wrapper", flatten=True)


@dataclass(frozen=True)
class ServerOptConfig(registry.Named):
    """A server optimizer for the algorithm's server step (algorithms that accept one)."""

    KIND = "server_opt"

    name: str = field(
        "sgd", doc="x ← x − step: sgd, momentum, adam, yogi or adagrad (Reddi et al. 2021), or "
                   "package.module:Name, a callable (section, lr) -> ServerOpt (an optax-shaped "
                   "init/update pair; rayfl.algorithms.server_opt)")
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
    params: Any = field(None, doc="validated keys of a user server optimiser", flatten=True)
