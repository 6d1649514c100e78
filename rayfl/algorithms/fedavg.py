"""FedAvg (McMahan et al., 2017): plain local SGD; the server applies x ← x − η_g Δ̄."""

from __future__ import annotations

from rayfl.algorithms.base import Algorithm


class FedAvg(Algorithm):
    """Stateless clients; Δ̄ is the weighted mean of x_t − y_i. Everything is the base default."""

    name = "fedavg"
