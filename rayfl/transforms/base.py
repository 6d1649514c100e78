"""The aggregation transform's base class and the two transforms every run can name without
their own module: ``identity`` and per-client clipping (``clip``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl import schema
from rayfl.algorithms.base import Vec
from rayfl.layers import Layer, LayerTraits


class Transform(Layer):
    """A transform in ``layers`` (``aggregation.transforms``): identity by default; a step
    without per-client state or broadcast values overrides :meth:`~rayfl.layers.Layer.client`."""


class Identity(Transform):
    """Leaves every update and the sum unchanged."""

    name = "identity"


@dataclass(frozen=True)
class ClipParams:
    """Per-client update-norm clipping."""

    max_norm: float = schema.field(1.0, doc="S: each client update Δ_i is scaled to ‖Δ_i‖ ≤ S",
                                   lo=0.0, lo_open=True)


class ClipUpdate(Transform):
    """Δ_i ← Δ_i · min(1, S / (‖Δ_i‖ + 1e-6)) (``torch.nn.utils.clip_grad_norm_``'s rule), the
    user-level clipping of DP-FedAvg and norm bounding against attackers (Sun et al., 2019); a
    client's own state still sees its unclipped model."""

    name = "clip"
    Params = ClipParams
    traits = LayerTraits(search_space={
        "aggregation.transforms.clip.max_norm": {"low": 0.1, "high": 10.0, "log": True}})

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        norm = torch.linalg.vector_norm(delta)
        return delta * torch.clamp(self.p.max_norm / (norm + 1e-6), max=1.0)
