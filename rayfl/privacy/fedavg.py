"""User-level differential privacy (DP-FedAvg, McMahan et al., ICLR 2018): accounting.

A round samples clients (Poisson with rate q = K / N, or K of N without replacement), clips
each participant's update to norm S, adds Gaussian noise of standard deviation z·S to the sum
and divides by the expected number of participants K (the fixed-denominator estimator); the
noise and clipping are the :class:`rayfl.transforms.dp.GaussianDP` transform. ε after t rounds
at the configured δ comes from Google's ``dp-accounting`` (RDP, or PLD for Poisson sampling):
t self-compositions of the sampled Gaussian mechanism. It depends only on (q or N, K, z, t, δ),
so a resumed run reports the same ε without keeping accountant state.

Each sampling mode has its own neighbouring relation (:data:`RELATIONS`), and dp-accounting's
noise multiplier is the noise over the sum's L2 sensitivity *under that relation*. Poisson
sampling is accounted for add-or-remove-one neighbours: one client's clipped update moves the
sum by at most S, so the event's multiplier is z. Sampling exactly K of N is accounted for
replace-one neighbours (adding a client would change N): replacing one client's update by
another's moves the sum by up to 2S (+S·e against −S·e), so the event's multiplier is z / 2.
"""

from __future__ import annotations

import contextlib
import logging
import math

from rayfl.deferred import deferred

dpa, pld, rdp = (deferred(f"dp_accounting{m}") for m in ("", ".pld", ".rdp"))


#: the neighbouring relation ε is stated under, by sampling mode
RELATIONS = {"poisson": "add-or-remove-one", "fixed": "replace-one"}
#: the L2 sensitivity of the round's sum in units of the clip norm S, by sampling mode
SENSITIVITY = {"poisson": 1.0, "fixed": 2.0}


def round_event(sampling: str, num_clients: int, per_round: int,
                noise_multiplier: float) -> dpa.DpEvent:
    """One round's mechanism: the Gaussian mechanism on a sampled set of clients, its noise
    multiplier relative to the sum's sensitivity under the sampling mode's relation."""
    gaussian = dpa.GaussianDpEvent(noise_multiplier / SENSITIVITY[sampling])
    if sampling == "poisson":
        return dpa.PoissonSampledDpEvent(per_round / num_clients, gaussian)
    return dpa.SampledWithoutReplacementDpEvent(num_clients, per_round, gaussian)


def epsilon(rounds: int, delta: float, sampling: str, num_clients: int, per_round: int,
            noise_multiplier: float, accountant: str = "rdp") -> float:
    """ε of ``rounds`` rounds at ``delta`` (0 rounds: 0; no noise: inf)."""
    if rounds <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    event = dpa.SelfComposedDpEvent(
        round_event(sampling, num_clients, per_round, noise_multiplier), rounds)
    if sampling == "fixed":
        acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    else:
        acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant()
    with _without_order_warnings():
        acc.compose(event)
        return float(acc.get_epsilon(delta))


@contextlib.contextmanager
def _without_order_warnings():
    """dp-accounting's RDP accountant warns for every order whose moment does not converge at a
    small noise multiplier and leaves that order out, which can only raise ε: kept off the
    user's terminal, where it would repeat every round."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def rounds_within(target: float, limit: int, **kw) -> int:
    """The most rounds (≤ ``limit``) whose ε stays ≤ ``target`` (binary search; ε grows with t)."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if epsilon(mid, **kw) <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo
