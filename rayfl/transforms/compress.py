"""Client-to-server compression: QSGD quantisation, top-k and random-k sparsification.

Each compressor C maps a client's update to what it would upload. With ``error_feedback`` the
client keeps the residual e_i of what compression dropped and adds it to its next update
(v = Δ_i + e_i; send C(v); e_i ← v − C(v); Seide et al. 2014, Karimireddy et al. 2019): e_i is
persistent client state in the state store, so it spills, checkpoints and resumes like an
algorithm's. Random draws come from generators keyed by (seed, round, client, purpose).

Bytes: QSGD sends ‖v‖ (4 bytes) and ``bits`` per coordinate (sign and level); top-k sends k
values and k 4-byte indices; random-k sends k values only (the server regenerates the indices
from the shared seed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rayfl import rng, schema
from rayfl.algorithms.base import Vec
from rayfl.layers import ClientContext
from rayfl.transforms.base import Transform

INDEX_BYTES = 4


class Compressor(Transform):
    """A compressor with optional error feedback (subclasses define :meth:`compress`)."""

    def compress(self, v: Vec, t: int, client: int) -> Vec:
        raise NotImplementedError

    def client_apply(self, delta: Vec, t: int, client: int, ctx: ClientContext) -> Vec:
        if not self.p.error_feedback:
            return self.compress(delta, t, client)
        residual = ctx.state.get("residual")
        if residual is not None and residual.numel() != delta.numel():
            raise ValueError(f"client {client}'s residual holds {residual.numel()} numbers and "
                             f"its upload now {delta.numel()}: with error feedback the upload "
                             "(the update, then the algorithm's Upload entries) keeps its size "
                             "from round to round")
        v = delta if residual is None else delta + residual.to(delta)
        sent = self.compress(v, t, client)
        ctx.state["residual"] = (v - sent).detach().clone()
        return sent

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        return self.compress(delta, t, client)


@dataclass(frozen=True)
class QSGDParams:
    """Stochastic quantisation to s = 2^(bits−1) − 1 levels per sign (QSGD)."""

    bits: int = schema.field(8, doc="bits per coordinate, sign included: s = 2^(bits-1) - 1 "
                                    "levels of abs(v_i)/‖v‖ (2: ternary)", lo=2, hi=16)
    error_feedback: bool = schema.field(False, doc="keep what quantisation dropped as client "
                                                   "state and add it to the next update")


class QSGD(Compressor):
    """Q(v)_i = ‖v‖ · sign(v_i) · ξ_i / s with ξ_i = ⌊s|v_i|/‖v‖⌋ + Bernoulli(frac): unbiased,
    E[Q(v)] = v (Alistarh et al., NeurIPS 2017)."""

    name = "qsgd"
    Params = QSGDParams

    @property
    def levels(self) -> int:
        return 2 ** (self.p.bits - 1) - 1

    def compress(self, v: Vec, t: int, client: int) -> Vec:
        norm = float(torch.linalg.vector_norm(v.double()))
        if norm == 0.0:
            return torch.zeros_like(v)
        s = self.levels
        scaled = v.double().abs() * (s / norm)
        low = torch.floor(scaled)
        u = torch.from_numpy(rng.client_stream(self.seed, t, client, rng.QSGD).random(v.numel()))
        xi = low + (u < (scaled - low)).double()
        return (torch.sign(v.double()) * xi * (norm / s)).to(v.dtype)

    def upload_bytes(self, numel: int, incoming: float) -> float:
        return 4.0 + math.ceil(numel * self.p.bits / 8)


@dataclass(frozen=True)
class SparseParams:
    """Keep a fraction of the coordinates."""

    fraction: float = schema.field(0.01, doc="share of coordinates kept: k = ⌈fraction · d⌉",
                                   lo=0.0, hi=1.0, lo_open=True)
    error_feedback: bool = schema.field(False, doc="keep the dropped coordinates as client "
                                                   "state and add them to the next update")


class _Sparse(Compressor):
    Params = SparseParams

    def k(self, numel: int) -> int:
        return max(1, math.ceil(round(self.p.fraction * numel, 9)))

    def indices(self, v: Vec, t: int, client: int) -> torch.Tensor:
        raise NotImplementedError

    def compress(self, v: Vec, t: int, client: int) -> Vec:
        out = torch.zeros_like(v)
        idx = self.indices(v, t, client)
        out[idx] = v[idx]
        return out


class TopK(_Sparse):
    """The k coordinates of largest |v_i| (ties: lower index), the rest zero."""

    name = "topk"

    def indices(self, v: Vec, t: int, client: int) -> torch.Tensor:
        return torch.argsort(-v.abs(), stable=True)[:self.k(v.numel())]

    def upload_bytes(self, numel: int, incoming: float) -> float:
        return self.k(numel) * (incoming / numel + INDEX_BYTES)


class RandK(_Sparse):
    """k coordinates drawn uniformly without replacement (unscaled: a contraction, as error
    feedback assumes; without it the expected update is (k/d)·Δ_i)."""

    name = "randk"

    def indices(self, v: Vec, t: int, client: int) -> torch.Tensor:
        draw = rng.client_stream(self.seed, t, client, rng.RANDK)
        return torch.from_numpy(draw.choice(v.numel(), self.k(v.numel()), replace=False))

    def upload_bytes(self, numel: int, incoming: float) -> float:
        return self.k(numel) * incoming / numel


def entry_of(comp) -> dict:
    """The ``compression`` section as an ``aggregation.transforms`` entry."""
    entry = {"name": comp.method, "error_feedback": comp.error_feedback}
    entry.update({"bits": comp.bits} if comp.method == "qsgd" else {"fraction": comp.fraction})
    return entry
