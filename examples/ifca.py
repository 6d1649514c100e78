"""IFCA (Ghosh, Chung, Yin & Ramchandran, NeurIPS 2020): k cluster models; each client trains
the one that fits its data best, and the server moves each model by its own clients' updates.

Run it (from the repository root)::

    rayfl run configs/test/tiny.yaml algorithm.name=examples.ifca:IFCA algorithm.clusters=2

Each round a client scores the k models θ_0..θ_{k−1} on its training rows, takes
ĵ = argmin_j F_i(θ_j) (ties: the lower j), trains θ_ĵ locally to y_i and uploads Δ_i = θ_ĵ − y_i
into cluster ĵ's part and 1 into ĵ's member count. The main upload is cluster 0's part; clusters
1..k−1 and the counts are :class:`~rayfl.algorithms.base.Upload` payload entries, so every layer
treats the whole as one upload: ``clip`` bounds all of it, a compressor compresses all of it,
``privacy`` noises every sum (the counts included). The server then steps each model by its
clients' mean update, θ_j ← θ_j − η_g · S_j / max(c_j, 1) (the model-averaging IFCA). A
layer changes the counts with the rest: clipped, each client counts by its clip factor f_i
(S_j / c_j is then Σ f_i Δ_i / Σ f_i, the updates weighted by their clip factors) and
``cluster0_share`` is the share of that weight; noised, a count can fall below 1, which the max
keeps from inflating the step. The run's model x is θ_0; the others are evaluated as
``cluster1``, ``cluster2``, ... With k = 1 nothing but the upload is sent and IFCA is FedAvg
with uniform weights, byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rayfl import schema
from rayfl.algorithms.base import Algorithm, ClientResult, ServerParams, Traits, Upload


@dataclass(frozen=True)
class IFCAParams(ServerParams):
    clusters: int = schema.field(2, doc="k: the cluster models", lo=1)
    init_std: float = schema.field(0.01, doc="std of the Gaussian added to x0 for clusters "
                                             "1..k-1 (they must differ to be chosen)", lo=0.0)
    init_seed: int = schema.field(0, doc="seed of that Gaussian")


@dataclass(frozen=True)
class IFCAState:
    others: torch.Tensor  # θ_1..θ_{k−1}, (k − 1) × d


class IFCA(Algorithm):
    """Iterative federated clustering: k models, each client in the cluster it fits best."""

    Params = IFCAParams
    traits = Traits(weighting="uniform", dp_post_processing=True,
                    capabilities=frozenset({"extra_models"}),
                    averaging="its k models are not one model to average over rounds")

    def server_init(self, x0):
        k, d = self.p.clusters, x0.numel()
        g = torch.Generator().manual_seed(self.p.init_seed)
        noise = torch.randn(k - 1, d, generator=g, dtype=torch.float64).to(x0.dtype)
        return IFCAState(x0 + self.p.init_std * noise)

    def broadcast(self, x, state, t):
        return {"x": x, "others": state.others}

    def client_train(self, task, ctx):
        models = torch.cat([task.bc["x"][None], task.bc["others"]])
        k = len(models)
        j = 0 if k == 1 else self.cluster_of(ctx, models)
        start = models[j]
        y = ctx.train(start=start)
        delta = start - y
        if k == 1:
            return ClientResult(y, upload=delta)
        rows = torch.zeros(k - 1, delta.numel(), dtype=delta.dtype)
        members = torch.zeros(k, dtype=delta.dtype)
        members[j] = 1.0
        if j > 0:
            rows[j - 1] = delta
        return ClientResult(y, {"clusters": Upload(rows), "members": Upload(members)},
                            upload=delta if j == 0 else torch.zeros_like(delta))

    @staticmethod
    def cluster_of(ctx, models) -> int:
        """ĵ: the model of least loss on the client's training rows (no gradients taken)."""
        rows = np.arange(ctx.n)
        losses = []
        for theta in models:
            logits, _, labels = ctx.features(theta, rows)
            losses.append(float(ctx.loss(logits, labels)))
        return int(np.argmin(losses))

    def server_update(self, x, state, agg, srv):
        if self.p.clusters == 1:
            return srv.step(agg.delta_mean), state, {}
        if agg.count == 0:  # nobody completed: nothing was sent
            return x, state, {}
        counts = agg.extras["members"].clamp_min(1.0)
        x_new = srv.step(agg.delta_sum / counts[0])
        others = state.others - self.server_lr * agg.extras["clusters"] / counts[1:, None]
        return x_new, IFCAState(others), {"cluster0_share": float(agg.extras["members"][0])
                                          / max(float(agg.extras["members"].sum()), 1.0)}

    def extra_models(self, x, state):
        return {f"cluster{j + 1}": theta for j, theta in enumerate(state.others)}
