"""FedBABU (Oh, Kim & Yun, ICLR 2022, "FedBABU: Towards Enhanced Representation for Federated
Image Classification"): federated training of the body only; the head never trains.

During federated training every client updates the body θ_ext by local SGD with the head
θ_cls frozen at its random initialisation (the same on every client: the global model's), and
the server averages the body (FedAvg). Personalisation is fine-tuning the whole model on each
client's data at evaluation: ``eval.finetune_steps`` (and ``eval.finetune_lr``) with
``eval.clients`` score it as ``personal_accuracy_*``. The frozen part is the classifier head
by default (``algorithm.frozen``: any parameter group). Stateless.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import ServerParams
from rayfl.algorithms.partial import PartialModel


@dataclass(frozen=True)
class FedBABUParams(ServerParams):
    """FedBABU hyper-parameters."""

    frozen: str = schema.field("head", doc="the part never trained in federated rounds: a "
                                           "parameter group (head, body, norm, embedding, or "
                                           "a glob)")


class FedBABU(PartialModel):
    """FedAvg on the body; the head stays at its initialisation."""

    name = "fedbabu"
    Params = FedBABUParams
    # nothing of its own: the head never trains; personalised by fine-tuning
    # (eval.finetune_steps), not kept; stateless clients, a server step on Δ̄
    traits = dataclasses.replace(PartialModel.traits, client_state={}, capabilities=(),
                                 asynchronous=None)
    group_keys = ("frozen",)

    @property
    def personal_group(self) -> str | None:
        return None

    @property
    def frozen_group(self) -> str | None:
        return self.p.frozen
