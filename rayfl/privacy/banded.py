"""Banded matrix-factorisation noise (Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta &
Xu, NeurIPS 2023, "(Amplified) Banded Matrix Factorization: A Unified Approach to Private
Training").

The model needs the prefix sums A G of the rounds' clipped sums G (rows g_t; A the n × n
lower-triangular matrix of ones). The workload is factorised A = B C with C lower-triangular,
b-banded and Toeplitz, C_{ts} = c_{t−s} for 0 ≤ t − s < b; the mechanism releases C G + Z
(rows of Z iid N(0, σ² I)) and the model sees B (C G + Z) = A G + B Z. Round t's sum therefore
receives w_t with w = C⁻¹ Z, computed forward with the last b − 1 of them (O(b·d) memory):

    w_t = (Z_t − Σ_{j=1}^{b−1} c_j w_{t−j}) / c_0,    Z_t regenerable from (seed, t).

Sensitivity (the paper's Theorem 2): a client taking part in rounds π adds Σ_{t∈π} C[:, t] u_tᵀ
(‖u_t‖ ≤ S). Columns of a b-banded C at least b apart have disjoint supports, so with
participations at least b rounds apart the sensitivity² is S² Σ_{t∈π} ‖C[:, t]‖² ≤ S² |π|
once every column has norm ≤ 1, which :func:`coefficients` ensures by normalising ‖c‖ = 1 (the
last b − 1 columns of a finite horizon are shorter). With at most k participations in n rounds
the releases are one Gaussian mechanism with noise multiplier z / sqrt(min(k, ⌈n / b⌉)).

The bands: ``sqrt`` truncates the square-root factorisation A = C² (c_j the coefficients of
(1 − x)^(−1/2): c_0 = 1, c_j = c_{j−1} (2j − 1) / (2j), i.e. binom(2j, j) / 4^j) to b bands and
divides by its norm; ``optimized`` minimises the expected total squared error of the n prefix
sums at that sensitivity, ‖c‖² · ‖A C⁻¹‖_F² (A C⁻¹ is Toeplitz with first column β, the
cumulative sum of C⁻¹'s first column, so ‖A C⁻¹‖_F² = Σ_j (n − j) β_j²), over the b free
coefficients with L-BFGS from the ``sqrt`` bands (kept only if c(x) has no root in the unit disc,
so the recurrence stays bounded past the horizon), then normalises. With b = 1, C = I:
independent noise every round (DP-SGD without amplification).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from rayfl import rng
from rayfl.deferred import deferred

optimize, signal = deferred("scipy.optimize"), deferred("scipy.signal")



def sqrt_coefficients(bands: int) -> np.ndarray:
    """The first ``bands`` coefficients of (1 − x)^(−1/2) (unnormalised)."""
    c = np.ones(bands)
    for j in range(1, bands):
        c[j] = c[j - 1] * (2 * j - 1) / (2 * j)
    return c


def toeplitz(c: np.ndarray, n: int) -> np.ndarray:
    """The n × n lower-triangular Toeplitz matrix with first column c (zero below its bands)."""
    col = np.zeros(n)
    col[:min(len(c), n)] = c[:n]
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return np.where(diff >= 0, col[np.clip(diff, 0, n - 1)], 0.0)


def prefix_column(c: np.ndarray, n: int) -> np.ndarray:
    """β: the first column of A C⁻¹ (the Toeplitz B), the cumulative sum of C⁻¹'s."""
    impulse = np.zeros(n)
    impulse[0] = 1.0
    return np.cumsum(signal.lfilter([1.0], c, impulse))


def prefix_error(c: np.ndarray, n: int) -> float:
    """‖c‖² Σ_j (n − j) β_j²: the expected total squared error of the n prefix sums per
    coordinate, at unit noise multiplier and a sensitivity of one participation."""
    beta = prefix_column(c, n)
    return float(np.dot(c, c) * np.dot(n - np.arange(n), beta ** 2))


def _loss_and_gradient(c: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    """:func:`prefix_error` and its gradient: ∂β/∂c_i is −x^i β(x)/c(x), the shifted g = β/c."""
    with np.errstate(all="ignore"):
        beta = prefix_column(c, n)
        weight = n - np.arange(n)
        error = float(np.dot(weight, beta ** 2))
        g = signal.lfilter([1.0], c, beta)
        v = weight * beta
        d_error = np.array([-2.0 * np.dot(v[i:], g[:n - i]) for i in range(len(c))])
        norm2 = float(np.dot(c, c))
        loss = norm2 * error
        grad = 2.0 * c * error + norm2 * d_error
    if not np.isfinite(loss) or not np.all(np.isfinite(grad)):
        return 1e300, np.zeros_like(c)
    return loss, grad


@lru_cache(maxsize=32)
def _optimized(bands: int, n: int) -> tuple[float, ...]:
    start = sqrt_coefficients(bands)
    result = optimize.minimize(_loss_and_gradient, start, args=(n,), jac=True,
                               method="L-BFGS-B", options={"maxiter": 2000, "ftol": 1e-13,
                                                           "gtol": 1e-10})
    stable = bands == 1 or np.abs(np.roots(result.x[::-1])).min() > 1  # C⁻¹ stays bounded
    c = result.x if stable and prefix_error(result.x, n) < prefix_error(start, n) else start
    return tuple(c / np.linalg.norm(c))


def coefficients(bands: int, method: str = "sqrt", horizon: int | None = None) -> np.ndarray:
    """c_0..c_{b−1} with ‖c‖ = 1: ``sqrt`` (any horizon) or ``optimized`` for ``horizon``
    rounds."""
    bands = min(bands, horizon) if horizon else bands
    if method == "sqrt":
        c = sqrt_coefficients(bands)
        return c / np.linalg.norm(c)
    if method == "optimized":
        if horizon is None:
            raise ValueError("optimized bands need the horizon they minimise the error over")
        return np.array(_optimized(bands, horizon))
    raise ValueError(f"no band method {method!r}")


class BandedNoise:
    """Round-by-round w_t = (C⁻¹ Z)_t at unit σ (the caller scales it); :meth:`state` holds the
    last b − 1 of them and the coefficients, so a resumed or forked run continues the same C."""

    def __init__(self, seed: int, coefficients: np.ndarray):
        self.seed = seed
        self.c = np.asarray(coefficients, dtype=np.float64)
        self.next_round = 0
        self.history: list[np.ndarray] = []  # w_{t−1}, w_{t−2}, … (at most b − 1)

    def z(self, t: int, dim: int) -> np.ndarray:
        """Z_t: standard normal, keyed by (seed, t)."""
        return rng.stream(self.seed, rng.BAND_NOISE, t).standard_normal(dim)

    def round_noise(self, t: int, dim: int) -> np.ndarray:
        """w_t: what round ``t``'s sum receives."""
        if t != self.next_round:
            raise ValueError(f"banded noise for round {t} after round {self.next_round - 1}")
        w = self.z(t, dim)
        for j, previous in enumerate(self.history, start=1):
            w -= self.c[j] * previous
        w /= self.c[0]
        self.history = [w, *self.history][:len(self.c) - 1]
        self.next_round = t + 1
        return w

    def fresh_state(self) -> dict:
        """The :meth:`state` before round 0."""
        return {"coefficients": self.c.copy(), "next_round": 0, "history": []}

    def state(self) -> dict:
        """Coefficients, next round and the last b − 1 noise vectors (plain data)."""
        return {"coefficients": self.c.copy(), "next_round": self.next_round,
                "history": list(self.history)}

    def load_state(self, state: dict) -> None:
        """Continue from :meth:`state` (its coefficients replace this object's)."""
        self.c = np.asarray(state["coefficients"], dtype=np.float64)
        self.next_round = int(state["next_round"])
        self.history = [np.asarray(v, dtype=np.float64) for v in state["history"]]
