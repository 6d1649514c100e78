"""FedRep (Collins, Hassani, Mokhtari & Shakkottai, ICML 2021, "Exploiting Shared
Representations for Personalized Federated Learning").

Each selected client i, from the global representation φ^t and its own head h_i:
    h_i ← τ_h passes of SGD on f_i(φ^t, h)       (representation frozen)
    φ_i ← τ_φ passes of SGD on f_i(φ, h_i) from φ^t  (head frozen)
and uploads φ_i (the server averages: FedAvg on the representation); h_i stays with the
client. A pass is the round's local schedule (``local.epochs`` epochs or ``local.steps``
minibatches); the paper's τ_h = 10 epochs, τ_φ = 1. The head is the classifier by default
(``algorithm.personal``). τ_φ = 0 is local head training on a fixed representation (the global
model does not move). ``eval.clients`` scores φ^t with h_i as ``personal_accuracy_*``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rayfl import schema
from rayfl.algorithms.base import ServerParams
from rayfl.algorithms.partial import PartialModel


@dataclass(frozen=True)
class FedRepParams(ServerParams):
    """FedRep hyper-parameters."""

    personal: str = schema.field("head", doc="the client's head h_i: a parameter group (head, "
                                             "body, norm, embedding, or a glob)")
    head_passes: int = schema.field(10, doc="τ_h: passes of the local schedule over the head, "
                                            "representation frozen (paper: 10 epochs)", lo=0,
                                    hi=1000)
    body_passes: int = schema.field(1, doc="τ_φ: passes over the representation, head frozen "
                                           "(paper: 1 epoch; 0: local head training only)",
                                    lo=0, hi=1000)


class FedRep(PartialModel):
    """Alternating local updates: the client's head, then the shared representation."""

    name = "fedrep"
    Params = FedRepParams

    traits = dataclasses.replace(PartialModel.traits, search_space={
        "algorithm.head_passes": {"type": "int", "low": 1, "high": 10}})

    def client_train(self, task, ctx):
        y = self.start(task, ctx)
        head = ctx.group(self.personal_group)
        self.steps(ctx, y, trainable=head, passes=self.p.head_passes)
        self.steps(ctx, y, trainable=~head, passes=self.p.body_passes)
        return self.finish(ctx, y)
