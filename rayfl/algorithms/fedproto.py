"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang & Zhang, AAAI 2022, "FedProto: Federated Prototype
Learning across Heterogeneous Clients"): clients share class prototypes, not parameters.

Every client keeps its whole model (its persistent state; the common initial model on its first
round) and trains it on

    L(F_i(x), y) + λ ‖f_i(x) − C̄^(y)‖²    (mean squared error per sample, as the authors' code)

where f_i(x) is the representation before the classifier (``repr``) and C̄^(y) the global
prototype of the sample's class (no term for a class without one yet). After training it sends,
per class j, the sum of its representations and its count |D_{i,j}| (its local prototype
C_i^(j) = mean of f_i over D_{i,j}, computed with the trained model, weighted by |D_{i,j}|); the
server's new global prototype is C̄^(j) = Σ_i |D_{i,j}| C_i^(j) / Σ_i |D_{i,j}| over the round's
clients holding class j, and a class no client of the round holds keeps its prototype.

No parameter is uploaded: the global model stays at its initialisation, so compare FedProto by
``eval.clients``' ``personal_accuracy_*`` (each client's own model and classifier), not by the
global test accuracy. λ = 0 is local training.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from rayfl import schema
from rayfl.algorithms.base import (Aggregate, ClientResult, ClientTask, ServerParams, ServerRound,
                                   Vec)
from rayfl.algorithms.partial import PartialModel
from rayfl.schema import ConfigError

EVAL_CHUNK = 512  # rows per forward pass when computing the local prototypes


@dataclass(frozen=True)
class FedProtoParams(ServerParams):
    """FedProto hyper-parameters (the authors' code: λ = 1)."""

    lam: float = schema.field(1.0, doc="λ: weight of the distance to the global prototypes",
                              lo=0.0)


@dataclass(frozen=True)
class FedProtoState:
    """The global prototypes C̄ (C × d once a round has reported) and which classes have one
    (x is never updated)."""

    protos: Vec
    known: Vec


class FedProto(PartialModel):
    """Whole models kept by the clients; class prototypes averaged by the server."""

    name = "fedproto"
    Params = FedProtoParams
    # the whole model is the client's, its statistics too; the server reads per-class sums of
    # representations (no DP post-processing)
    traits = dataclasses.replace(
        PartialModel.traits, local_buffers=True, dp_post_processing=False,
        search_space={"algorithm.lam": {"low": 1e-2, "high": 10.0, "log": True}})
    group_keys = ()

    @property
    def personal_group(self) -> str:
        return "*"

    @classmethod
    def check_model(cls, params, layout, handle) -> None:
        if handle.label_len or handle.kind == "ids":
            raise ConfigError("algorithm.name", cls.name, "an algorithm other than fedproto "
                              "for this dataset (class prototypes need one class label per "
                              "row)")

    def server_init(self, x0: Vec) -> FedProtoState:
        return FedProtoState(x0.new_zeros(0), x0.new_zeros(0))

    def broadcast(self, x: Vec, state: FedProtoState, t: int):
        return {"x": x, "protos": state.protos, "known": state.known}

    def server_update(self, x: Vec, state: FedProtoState, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        sums, counts = agg.extras["proto_sum"], agg.extras["proto_count"]
        held = counts > 0
        protos = state.protos.clone() if state.protos.numel() else torch.zeros_like(sums)
        protos[held] = sums[held] / counts[held].unsqueeze(1)
        known = state.known if state.known.numel() else torch.zeros_like(counts)
        return x, FedProtoState(protos, torch.maximum(known, held.to(known))), \
            {"prototypes": float(held.sum())}

    def client_train(self, task: ClientTask, ctx):
        y, opt = self.start(task, ctx), ctx.optimizer()
        protos, known = task.bc["protos"], task.bc["known"]
        for batch in ctx.batches():
            logits, feats, labels = ctx.outputs(y, batch, ("repr",))
            loss = ctx.loss(logits, labels)
            if self.p.lam and protos.numel():
                z = feats["repr"].flatten(1)
                target = torch.where((known[labels] > 0).unsqueeze(1), protos[labels].to(z),
                                     z.detach())
                loss = loss + self.p.lam * torch.nn.functional.mse_loss(z, target)
            opt.step(y, ctx.backward(loss))
        sums, counts = local_prototypes(ctx, y)
        result = self.finish(ctx, y)
        return ClientResult(result.model, {"proto_sum": sums, "proto_count": counts},
                            result.state)


def local_prototypes(ctx, y) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-class sums of the representations, per-class counts) over all the client's rows,
    with model ``y`` (training-mode forwards without gradients; BatchNorm statistics left as
    training left them)."""
    sums = counts = None
    for lo in range(0, ctx.n, EVAL_CHUNK):
        rows = np.arange(lo, min(lo + EVAL_CHUNK, ctx.n))
        logits, feats, labels = ctx.features(y, rows, ("repr",))
        z = feats["repr"].flatten(1).to(y.dtype)
        if sums is None:
            sums = z.new_zeros(logits.shape[1], z.shape[1])
            counts = z.new_zeros(logits.shape[1])
        sums.index_add_(0, labels, z)
        counts.index_add_(0, labels, torch.ones_like(labels, dtype=z.dtype))
    return sums, counts
