"""FedPer (Arivazhagan, Aggarwal, Singh & Choudhary, 2019, "Federated Learning with
Personalization Layers"): base layers shared, personalisation layers kept by each client.

Each selected client j trains its whole model — the global base layers W_B and its own
personalisation layers W_{P_j} — by local SGD, uploads the new W_B for FedAvg and keeps W_{P_j}.
The personalisation layers are the classifier head by default (``algorithm.personal``: any
parameter group, e.g. ``fc2.*`` or a glob naming the last two layers). Personal models (global
W_B with W_{P_j}) are what ``eval.clients`` scores as ``personal_accuracy_*``; the global
model's head stays at its initial values (no client uploads it).
"""

from __future__ import annotations

from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import ServerParams
from rayfl.algorithms.partial import PartialModel


@dataclass(frozen=True)
class FedPerParams(ServerParams):
    """FedPer hyper-parameters."""

    personal: str = schema.field("head", doc="the personalisation layers W_P: a parameter group "
                                             "(head, body, norm, embedding, or a glob over "
                                             "parameter names)")


class FedPer(PartialModel):
    """FedAvg on the base layers; each client keeps its personalisation layers."""

    name = "fedper"
    Params = FedPerParams
