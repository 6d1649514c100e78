"""FedAvg (McMahan et al., 2017): plain local SGD; the server applies x ← x − η_g Δ̄ (or
another server optimizer on Δ̄: the ``server_opt`` config section)."""

from __future__ import annotations

from rayfl.algorithms.base import Algorithm, Traits


class FedAvg(Algorithm):
    """Stateless clients; Δ̄ is the weighted mean of x_t − y_i. Everything is the base default."""

    name = "fedavg"
    # FedBuff and FedAsync are defined on it
    traits = Traits(server_opt=True, dp_post_processing=True, asynchronous=None)
