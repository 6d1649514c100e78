"""Secure aggregation's arithmetic: what the server can decode from a masked modular sum.

SecAgg (Bonawitz et al., CCS 2017) sums integer vectors modulo 2^b and reveals only the sum.
Simulated here: each client clips Δ_i to norm S, scales it to fixed point with f fractional
bits (the largest f with m · S · 2^f ≤ 2^(b−1) − 1, so the sum of m clipped clients fits the
signed range), rounds (to nearest, or randomised: ⌊x⌋ + Bernoulli(x − ⌊x⌋), unbiased) and sends
the integers; the server reduces the sum modulo 2^b into [−2^(b−1), 2^(b−1)) and divides by 2^f.
Summing the signed integers and reducing once equals summing the residues modulo 2^b (reduction
is a ring homomorphism), so the decode is exactly SecAgg's. The masks cancel and are not
simulated. Decode error: at most m · 2^−(f+1) per coordinate (nearest), m · 2^−f (randomised);
zero when every Δ_i · 2^f is an integer. More than m clients (Poisson sampling) can wrap around.
Dropped clients are the availability model's dropped clients: their masks are recovered, so
the sum is over the clients that completed. Weights must be uniform (SecAgg reveals a sum).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from rayfl import rng, schema
from rayfl.algorithms.base import Aggregate, Vec
from rayfl.layers import Facts, LayerTraits, summed_uploads
from rayfl.transforms.base import Transform


@dataclass(frozen=True)
class SecAggParams:
    """The modular sum's width and the fixed-point range."""

    bits: int = schema.field(16, doc="b: the sum is taken modulo 2^b (at most 24: float32 "
                                     "sums of integers stay exact)", lo=2, hi=24)
    clip_norm: float = schema.field(1.0, doc="S: each update is clipped to ‖Δ_i‖ ≤ S (bounds "
                                             "every coordinate by S)", lo=0.0, lo_open=True)
    max_clients: int = schema.field(0, doc="m: clients whose sum must fit the range (0: "
                                           "clients_per_round)", lo=0)
    randomized_rounding: bool = schema.field(True, doc="round x·2^f up with probability "
                                                       "frac(x·2^f) (unbiased) instead of to "
                                                       "nearest")


class SecAgg(Transform):
    """Secure aggregation's arithmetic: clip to S, fixed point with f fractional bits,
    (randomised) rounding, sum modulo 2^b, decode; error ≤ m·2^−f per coordinate."""

    name = "secagg"
    Params = SecAggParams
    traits = LayerTraits(transport=True, upload_sums=True)

    def __init__(self, params: SecAggParams | None = None, facts: Facts | None = None):
        super().__init__(params, facts)
        if self.params.max_clients == 0:  # m defaults to the round's clients
            self.params = dataclasses.replace(self.params,
                                              max_clients=self.facts.clients_per_round)

    @property
    def frac_bits(self) -> int:
        """f: the largest with m · S · 2^f ≤ 2^(b−1) − 1 (negative: coarser than integers)."""
        m = max(self.p.max_clients, 1)
        return math.floor(math.log2((2 ** (self.p.bits - 1) - 1) / (m * self.p.clip_norm)))

    def bound(self, clients: int) -> float:
        """Largest decode error per coordinate of a sum of ``clients`` (within range)."""
        return clients * 2.0 ** -self.frac_bits * (1.0 if self.p.randomized_rounding else 0.5)

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        norm = float(torch.linalg.vector_norm(delta.double()))
        x = delta.double() * (min(1.0, self.p.clip_norm / norm) if norm > 0 else 1.0)
        scaled = x * 2.0 ** self.frac_bits
        if self.p.randomized_rounding:
            low = torch.floor(scaled)
            u = torch.from_numpy(rng.client_stream(self.seed, t, client,
                                                   rng.SECAGG_ROUNDING).random(delta.numel()))
            ints = low + (u < scaled - low).double()
        else:
            ints = torch.round(scaled)
        return ints.to(delta.dtype)

    def decode(self, total: Vec) -> Vec:
        """The modular sum of the integer vectors, as real numbers."""
        m = 2.0 ** self.p.bits
        wrapped = torch.remainder(total.double() + m / 2, m) - m / 2
        return (wrapped * 2.0 ** -self.frac_bits).to(total.dtype)

    def aggregate(self, slot, agg: Aggregate, sums: dict, srv):
        if not agg.count:  # nobody completed: nothing was masked, there is no mean
            return agg, slot, {}
        total = self.decode(agg.delta_sum)
        sums = summed_uploads(agg.extras, agg.uploaded)
        extras = {k: self.decode(v) if k in sums else v for k, v in agg.extras.items()}
        return dataclasses.replace(agg, delta_sum=total, extras=extras,
                                   delta_mean=total / agg.weight_sum,
                                   delta_sq_sum=float("nan")), slot, {}

    def upload_bytes(self, numel: int, incoming: float) -> float:
        return math.ceil(numel * self.p.bits / 8)
