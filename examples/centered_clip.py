"""An aggregation transform of your own: centered clipping (Karimireddy, He & Jaggi, ICML 2021).

Run it: ``rayfl run configs/test/tiny.yaml "layers=[{name:
examples.centered_clip:CenteredClip, tau: 0.5}]"``. The server replaces the round's mean update
by v_L, from v_0 = the previous round's estimate (0 at the start):

    v_{l+1} = v_l + (1/m) Σ_i (Δ_i − v_l) · min(1, τ / ‖Δ_i − v_l‖),   l = 0..L−1

so a client whose update lies far from the others moves the estimate by at most τ/m. It reads
every update at once (``needs_updates``): the rules that refuse the built-in robust rules (SecAgg,
DP-FedAvg, algorithms with per-client sums) refuse it too. Its estimate is its server slot,
checkpointed and resumed with the run. With τ large and L = 1 its first round is the plain mean
(``trimmed_mean`` with β = 0).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from rayfl.layers import LayerTraits
from rayfl.schema import field
from rayfl.transforms import Transform


@dataclass(frozen=True)
class CenteredClipParams:
    tau: float = field(1.0, doc="τ: the radius each update's distance to the estimate is "
                                "clipped to", lo=0.0, lo_open=True)
    iterations: int = field(1, doc="L: clipping iterations per round", lo=1)


class CenteredClip(Transform):
    """The round's mean replaced by the centered-clipping estimate; its slot is the last one."""

    Params = CenteredClipParams
    traits = LayerTraits(needs_updates=True)

    def init(self, x0):
        return torch.zeros_like(x0)  # v_0 of round 1

    def aggregate(self, v, agg, sums, srv):
        if agg.count == 0:
            return agg, v, {}
        updates = agg.updates
        for _ in range(self.params.iterations):
            gap = updates - v
            scale = (self.params.tau / gap.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)
            v = v + (gap * scale[:, None]).mean(0)
        clipped = float((scale < 1).double().mean())  # the last iteration's share clipped
        return dataclasses.replace(agg, delta_mean=v), v, {"cclip_clipped": clipped}
