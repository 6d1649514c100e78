"""LG-FedAvg (Liang et al., 2020, "Think Locally, Act Globally: Federated Learning with Local
and Global Representations"): local representations, a global head.

Each selected client m trains its own representation layers θ^m_l together with the global
layers θ_g by local SGD, uploads θ_g for FedAvg and keeps θ^m_l. The local part is the body
(every layer but the classifier head) by default (``algorithm.personal``: any parameter group).
LG-FedAvg is FedPer with the other part kept: ``eval.clients`` scores each client's own
representation under the global head as ``personal_accuracy_*``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import ServerParams
from rayfl.algorithms.partial import PartialModel


@dataclass(frozen=True)
class LGFedAvgParams(ServerParams):
    """LG-FedAvg hyper-parameters."""

    personal: str = schema.field("body", doc="the local representation θ_l: a parameter group "
                                             "(body, head, norm, embedding, or a glob over "
                                             "parameter names)")


class LGFedAvg(PartialModel):
    """FedAvg on the global layers; each client keeps its representation layers."""

    name = "lgfedavg"
    Params = LGFedAvgParams
