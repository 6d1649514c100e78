"""FedBN (Li, Jiang, Zhang, Kamp & Dou, ICLR 2021, "FedBN: Federated Learning on Non-IID
Features via Local Batch Normalization"): normalisation layers stay local.

Every client keeps its own BatchNorm layers — affine parameters (γ, β) and running statistics
(μ, σ²) — and trains the whole model from the global non-BN parameters plus its own BN ones;
the server averages only the non-BN parameters (FedAvg on them). A client's first round starts
from the global BN parameters and statistics. The server still averages the clients'
statistics, for evaluating the global model only; the paper's models are the personal ones,
which ``eval.clients`` scores as ``personal_accuracy_*``. A model without normalisation layers
is refused (FedBN would be FedAvg).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import ServerParams
from rayfl.algorithms.partial import PartialModel


@dataclass(frozen=True)
class FedBNParams(ServerParams):
    """FedBN hyper-parameters."""

    personal: str = schema.field("norm", doc="the local part: the normalisation layers (or "
                                             "another parameter group)")


class FedBN(PartialModel):
    """FedAvg over every parameter outside the normalisation layers, which stay local."""

    name = "fedbn"
    Params = FedBNParams
    # each client trains with its own BatchNorm statistics
    traits = dataclasses.replace(PartialModel.traits, local_buffers=True)
