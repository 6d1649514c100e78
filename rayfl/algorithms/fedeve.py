"""FedEve (anonymous, ICLR submission, "FedEve: On Bridging the Client Drift and Period Drift
for Cross-Device Federated Learning").

A scalar Kalman filter on the server momentum. Server state: M (init 0), s = σ_t² (init 0).
    predict:   ŵ = x_t − η_g M                       (clients train from ŵ; D_k = ŵ − y_k)
    observe:   D = Σ p_k D_k
               q = ‖M − D‖² / (|S_t| d)                  (period drift, σ_Q²)
               r = Σ_k ‖D_k − D‖² / (|S_t|² d)           (client drift, σ_R²; unweighted over k)
    update:    ŝ = s + q;  K = ŝ / (ŝ + r);  M ← (1 − K) M + K D
               x_{t+1} = x_t − η_g M;  s ← (1 − K) ŝ
Σ_k ‖D_k − D‖² = Σ‖D_k‖² − 2⟨D, Σ D_k⟩ + |S_t| ‖D‖², so only the runtime's sums travel.
When ŝ + r = 0 (every D_k = D = M) K is taken as 1.

IMA is rejected: clients start from the prediction x_t − η_g M, not from x_t, so an IMA mean of
x_t would be moved again by −η_g M and the Kalman state M would filter updates measured from a
point IMA never deployed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rayfl.algorithms.base import Aggregate, Algorithm, ServerParams, ServerRound, Traits, Vec


@dataclass(frozen=True)
class FedEveParams(ServerParams):
    """FedEve hyper-parameters (only η_g; the paper adds none)."""


@dataclass(frozen=True)
class FedEveState:
    """The Kalman filter's server momentum M and its variance s = σ_t²."""

    M: Vec
    s: float


class FedEve(Algorithm):
    """Server state: M, s (x is x_t). Broadcast is the prediction ŵ."""

    name = "fedeve"
    Params = FedEveParams
    traits = Traits(
        asynchronous="its Kalman filter models the period drift between consecutive rounds' "
                     "mean updates",
        averaging="its clients start from the prediction x_t − η_g M, which would shift the "
                  "IMA mean again")

    def server_init(self, x0: Vec) -> FedEveState:
        return FedEveState(torch.zeros_like(x0), 0.0)

    def broadcast(self, x: Vec, state: FedEveState, t: int) -> dict[str, Vec]:
        return {"x": x - self.server_lr * state.M}  # ŵ = x_t − η_g M

    def server_update(self, x: Vec, state: FedEveState, agg: Aggregate, srv: ServerRound):
        if agg.count == 0:
            return x, state, {}
        n, d = agg.count, agg.delta_mean.numel()
        M, D = state.M, agg.delta_mean
        q = float((M - D).double().pow(2).sum()) / (n * d)
        Dd = D.double()
        spread = agg.delta_sq_sum - 2 * float(Dd @ agg.delta_sum.double()) + n * float(Dd @ Dd)
        r = max(spread, 0.0) / (n * n * d)
        s_hat = state.s + q
        K = s_hat / (s_hat + r) if s_hat + r > 0 else 1.0
        M = (1 - K) * M + K * D
        return x - self.server_lr * M, FedEveState(M, (1 - K) * s_hat), \
            {"kalman_gain": K, "q": q, "r": r}
