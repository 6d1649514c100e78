"""FedAvgM — server momentum (Hsu, Qi & Brown, 2019, "Measuring the Effects of Non-Identical
Data Distribution for Federated Visual Classification").

A preset: FedAvg with the ``momentum`` server optimizer. Clients run plain local SGD; with Δ̄ the
weighted mean pseudo-gradient:
    m ← β m + Δ̄;   x ← x − η_g m              (heavy ball)
    x ← x − η_g (Δ̄ + β m)                     (nesterov: PyTorch's SGD(nesterov=True) form)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms import server_opt as opt
from rayfl.algorithms.base import ServerParams
from rayfl.algorithms.fedavg import FedAvg


@dataclass(frozen=True)
class FedAvgMParams(ServerParams):
    """FedAvgM hyper-parameters."""

    momentum: float = schema.field(0.9, doc="server momentum β", lo=0.0, hi=1.0, hi_open=True)
    nesterov: bool = schema.field(False, doc="Nesterov look-ahead: x ← x − η_g (Δ̄ + β m)")


class FedAvgM(FedAvg):
    """Server state: the momentum buffer m (init 0)."""

    name = "fedavgm"
    Params = FedAvgMParams
    traits = dataclasses.replace(FedAvg.traits, search_space={
        "algorithm.momentum": {"low": 0.0, "high": 0.98}})

    def default_server_opt(self) -> opt.ServerOpt:
        return opt.momentum(self.server_lr, self.p.momentum, self.p.nesterov)
