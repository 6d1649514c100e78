"""One-shot empirical privacy estimation with canary clients (Andrew, Kairouz, Oh, Oprea,
McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024,
arXiv:2302.03098): an ε a run's own final model shows, beside the ε its accountant proves.

With ``privacy.audit_canaries: k`` the DP layer adds k canary clients to the population. Canary
j's update is one fixed direction c_j, drawn uniformly from the unit sphere of the model's
dimension d and scaled to the round's clip norm S; each round each canary takes part like an
ordinary client (probability K/N, within the participation schema of DP-FTRL and banded MF) and
its update enters the clipped sum before the noise (the paper's Algorithm 2). After the run, the
statistic of canary j is the cosine between c_j and the final model delta x_T − x_0 (the
paper's "final model" threat model, Algorithm 2; Algorithm 3, every iterate, is not done here);
k further directions drawn the same way but never inserted give the null statistics. Gaussians
are fitted to both samples, null N(μ₀, σ₀²) and canary N(μ₁, σ₁²), and the estimate is the ε at
the run's δ of the pair of Gaussians (Section 3, Algorithm 1: for the Gaussian mechanism the
null cosine is asymptotically N(0, 1/d) and the canary cosine Gaussian, so the estimate tends to
the mechanism's true ε as d grows, Theorems 3.1 and 3.2).

ε of two one-dimensional Gaussians P and Q: the privacy loss L(x) = log p(x)/q(x) is a quadratic
in x, so the region {L > ε} of the optimal (likelihood-ratio) test is a half-line, an interval
or the complement of one, and the hockey-stick divergence
δ_{P‖Q}(ε) = P(L > ε) − e^ε Q(L > ε) has a closed form in normal CDFs. The estimate is the
smallest ε ≥ 0 with max(δ_{P‖Q}(ε), δ_{Q‖P}(ε)) ≤ δ (Brent's method; δ(ε) falls with ε). With
equal variances it is the Gaussian mechanism's curve at μ = |μ₁ − μ₀| / σ
(δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), Balle and Wang 2018, Theorem 8), which is also
reported with σ the pooled standard deviation of both samples.

The estimate is a point estimate with sampling error, not a bound: a correct accountant's ε
lies above it up to that error (the final model is a post-processing of the mechanism's
releases), and one that clearly exceeds it means the mechanism leaks more than accounted. Two
limits: with few canaries the fitted variances are noisy, and at δ = 1e-5 a std ratio off by
a few per cent moves the estimate by tens of per cent (upward: any mismatch adds privacy loss);
and with a high sampling rate over few rounds the canary cosines are a visible mixture over the
canaries' participation counts, wider than one Gaussian, and the fitted ε comes near the
accountant's.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rayfl import rng
from rayfl.deferred import deferred
from rayfl.metrics.files import write_json
from rayfl.privacy.accounting import schema_of
from rayfl.privacy.participation import Participation, Schema
from rayfl.schema import ConfigError

optimize, stats = deferred("scipy.optimize"), deferred("scipy.stats")

FILE = "privacy_audit.json"


def direction(seed: int, j: int, dim: int, inserted: bool = True) -> np.ndarray:
    """Unit vector j of dimension ``dim``, uniform on the sphere (float64): canary j's update
    direction, or (``inserted`` False) null direction j, never inserted."""
    tag = rng.AUDIT_CANARY if inserted else rng.AUDIT_NULL
    g = rng.stream(seed, j, tag).standard_normal(dim)
    return g / math.sqrt(_dot(g, g))


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    """a · b without BLAS (whose threads would set the order of the sum)."""
    return float(np.einsum("i,i->", a, b))


def schedule(seed: int, count: int, rounds: int, rate: float,
             schema: Schema | None = None) -> np.ndarray:
    """(rounds × count) mask of the canaries taking part in each round: each with probability
    ``rate`` a round (one uniform draw per canary, keyed by seed and round), only while
    ``schema`` allows (≥ b rounds since its last participation, < k so far)."""
    out = np.zeros((rounds, count), dtype=bool)
    record = None if schema is None else Participation(count, schema)
    for t in range(rounds):
        take = rng.stream(seed, t, rng.AUDIT_SAMPLE).random(count) < rate
        if record is not None:
            take &= record.eligible(t)
            record.record(t, np.flatnonzero(take))
        out[t] = take
    return out


def cosines(delta: np.ndarray, seed: int, count: int, inserted: bool) -> np.ndarray:
    """cos(c_j, Δ) for the first ``count`` directions (inserted or null) and the delta Δ."""
    delta = np.asarray(delta, dtype=np.float64)
    norm = math.sqrt(_dot(delta, delta))
    if norm == 0.0:
        return np.zeros(count)
    return np.array([_dot(direction(seed, j, delta.size, inserted), delta) / norm
                     for j in range(count)])


# ----- ε of two Gaussians ---------------------------------------------------------------------
def _mass(lo: float, hi: float, mean: float, std: float) -> float:
    """P(lo < X < hi) for X ~ N(mean, std²), from the tail nearer the interval."""
    if lo >= mean:
        return float(stats.norm.sf(lo, mean, std) - stats.norm.sf(hi, mean, std))
    return float(stats.norm.cdf(hi, mean, std) - stats.norm.cdf(lo, mean, std))


def hockey_stick(eps: float, p: tuple[float, float], q: tuple[float, float]) -> float:
    """δ_{P‖Q}(ε) = sup_A P(A) − e^ε Q(A) for P = N(p) and Q = N(q), each (mean, std): the
    likelihood-ratio region {x: log p(x)/q(x) > ε} in closed form."""
    (a, s), (b, r) = p, q
    # log p/q − ε = α x² + β x + γ
    alpha = 0.5 / r ** 2 - 0.5 / s ** 2
    beta = a / s ** 2 - b / r ** 2
    gamma = 0.5 * b ** 2 / r ** 2 - 0.5 * a ** 2 / s ** 2 + math.log(r / s) - eps
    if alpha == 0.0:
        if beta == 0.0:  # P = Q
            return 0.0
        cut = -gamma / beta
        regions = [(cut, math.inf)] if beta > 0 else [(-math.inf, cut)]
    else:
        disc = beta ** 2 - 4 * alpha * gamma
        if disc <= 0:  # the quadratic keeps the sign of α: A is everything or nothing
            return max(0.0, 1.0 - math.exp(eps)) if alpha > 0 else 0.0
        roots = sorted(((-beta - math.sqrt(disc)) / (2 * alpha),
                        (-beta + math.sqrt(disc)) / (2 * alpha)))
        regions = [(-math.inf, roots[0]), (roots[1], math.inf)] if alpha > 0 else [tuple(roots)]
    p_mass = sum(_mass(lo, hi, a, s) for lo, hi in regions)
    q_mass = sum(_mass(lo, hi, b, r) for lo, hi in regions)
    return max(0.0, p_mass - math.exp(eps) * q_mass)


def delta_two_gaussians(eps: float, p: tuple[float, float], q: tuple[float, float]) -> float:
    """δ(ε) of the pair, both directions: max(δ_{P‖Q}(ε), δ_{Q‖P}(ε))."""
    return max(hockey_stick(eps, p, q), hockey_stick(eps, q, p))


def epsilon_two_gaussians(p: tuple[float, float], q: tuple[float, float],
                          delta: float) -> float:
    """The smallest ε ≥ 0 with δ(ε) ≤ ``delta`` for P = N(p), Q = N(q), each (mean, std); a
    std of 0 is a point mass (inf unless both are the same point)."""
    if not all(math.isfinite(v) for v in (*p, *q)) or p[1] < 0 or q[1] < 0:
        raise ValueError(f"two Gaussians need finite means and stds ≥ 0, got {p}, {q}")
    if p[1] == 0 or q[1] == 0:
        return 0.0 if p == q else math.inf

    def gap(e: float) -> float:
        return delta_two_gaussians(e, p, q) - delta

    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        if hi > 1e4:
            return math.inf
        hi *= 2
    return float(optimize.brentq(gap, hi / 2 if hi > 1 else 0.0, hi, xtol=1e-10, rtol=1e-10))


def gaussian_mechanism_epsilon(mu: float, delta: float) -> float:
    """ε at δ of the Gaussian mechanism whose sensitivity is ``mu`` noise standard deviations
    (the pair N(0, 1), N(μ, 1))."""
    return epsilon_two_gaussians((0.0, 1.0), (mu, 1.0), delta)


@dataclass(frozen=True)
class Estimate:
    """The fitted Gaussians of the two samples and the ε at δ between them: the paper's, with
    each sample's own variance, and the Gaussian mechanism's at one pooled variance (steadier
    with few canaries: a std ratio off by a few per cent moves the first by tens of per cent
    at δ = 1e-5; but blind to a canary spread wider than the null's)."""

    null_mean: float
    null_std: float
    canary_mean: float
    canary_std: float
    delta: float
    epsilon: float
    epsilon_equal_variance: float

    @classmethod
    def of(cls, canary: np.ndarray, null: np.ndarray, delta: float) -> "Estimate":
        """Fit N(mean, std²) to each sample (std with Bessel's correction); ε between them."""
        n1, n0 = len(canary), len(null)
        if n1 < 2 or n0 < 2:
            raise ValueError("the estimate needs at least two canary and two null statistics")
        fit = [(float(np.mean(x)), float(np.std(x, ddof=1))) for x in (null, canary)]
        pooled = math.sqrt(((n0 - 1) * fit[0][1] ** 2 + (n1 - 1) * fit[1][1] ** 2)
                           / (n0 + n1 - 2))
        gap = abs(fit[1][0] - fit[0][0])
        pooled_eps = gaussian_mechanism_epsilon(gap / pooled, delta) if pooled > 0 else \
            (0.0 if gap == 0 else math.inf)
        return cls(*fit[0], *fit[1], delta, epsilon_two_gaussians(fit[0], fit[1], delta),
                   pooled_eps)


# ----- the canaries of a run ------------------------------------------------------------------
@dataclass(frozen=True)
class Canaries:
    """A run's ``count`` canary clients: each round's participants and their summed update."""

    seed: int
    count: int
    rounds: int
    rate: float
    schema: Schema | None = None

    @classmethod
    def of(cls, privacy, facts) -> "Canaries | None":
        """The canaries of a ``privacy`` section (None when ``audit_canaries`` is 0): rate
        K/N, and the participation schema under dp_ftrl and banded_mf."""
        if not privacy.audit_canaries:
            return None
        schema = None if privacy.mechanism == "dp_fedavg" else schema_of(privacy)
        return cls(facts.seed, privacy.audit_canaries, facts.rounds,
                   min(1.0, facts.clients_per_round / facts.num_clients), schema)

    @cached_property
    def taking_part(self) -> np.ndarray:
        """(rounds × count) participation mask (:func:`schedule`)."""
        return schedule(self.seed, self.count, self.rounds, self.rate, self.schema)

    def round_sum(self, t: int, dim: int, clip: float) -> np.ndarray:
        """Σ_j S·c_j over round t's participating canaries (float64)."""
        total = np.zeros(dim)
        for j in np.flatnonzero(self.taking_part[t]):
            total += direction(self.seed, int(j), dim)
        return total * clip

    def report(self, delta_model: np.ndarray, rounds: int, delta: float,
               epsilon: float) -> dict:
        """The audit of a run whose final model moved by ``delta_model`` in ``rounds`` rounds,
        with the accountant's ``epsilon`` at ``delta``: what ``privacy_audit.json`` holds."""
        canary = cosines(delta_model, self.seed, self.count, inserted=True)
        null = cosines(delta_model, self.seed, self.count, inserted=False)
        est = Estimate.of(canary, null, delta)
        return {"canaries": self.count, "null_directions": self.count, "rounds": rounds,
                "dimension": int(np.asarray(delta_model).size), "delta": delta,
                "epsilon": epsilon, "epsilon_empirical": est.epsilon,
                "epsilon_empirical_equal_variance": est.epsilon_equal_variance,
                "canary_mean": est.canary_mean, "canary_std": est.canary_std,
                "null_mean": est.null_mean, "null_std": est.null_std,
                "participations": self.taking_part[:rounds].sum(axis=0).tolist(),
                "canary_cosines": canary.tolist(), "null_cosines": null.tolist()}


def canaries_of(stack) -> Canaries | None:
    """The canaries a run's stack inserts (None: no audit)."""
    return next((layer.canaries for layer in stack.transforms
                 if getattr(layer, "canaries", None) is not None), None)


def write(run_dir: str, canaries: Canaries, delta_model: np.ndarray, rounds: int,
          delta: float, epsilon: float) -> dict:
    """Write ``privacy_audit.json`` (:meth:`Canaries.report`) and return the summary's
    ``privacy_audit`` entry."""
    out = canaries.report(delta_model, rounds, delta, epsilon)
    write_json(out, os.path.join(run_dir, FILE))
    return {"privacy_audit": {"canaries": out["canaries"],
                              "epsilon_empirical": out["epsilon_empirical"]}}


def describe(run_dir: str) -> list[str]:
    """``rayfl privacy audit RUN_DIR``: the lines saying what a run's canaries show beside the
    accountant's ε (summary.json's, else the audit's own copy)."""
    if not os.path.isfile(os.path.join(run_dir, "config.yaml")):
        raise ConfigError("RUN_DIR", run_dir, "a run directory (made by `rayfl run`)")
    path = os.path.join(run_dir, FILE)
    if not os.path.isfile(path):
        raise ConfigError("RUN_DIR", run_dir, f"a finished run made with "
                                              f"privacy.audit_canaries > 0 (it has no {FILE})")
    a = _read(path)
    summary = os.path.join(run_dir, "summary.json")
    analytical = a.get("epsilon")
    if os.path.isfile(summary):
        analytical = _read(summary).get("epsilon", analytical)
    try:
        k, d, delta, emp = a["canaries"], a["dimension"], a["delta"], a["epsilon_empirical"]
        lines = [f"privacy audit of {run_dir}: {k} canaries and {a['null_directions']} null "
                 f"directions, {a['rounds']} rounds, model dimension {d}",
                 f"  canary cosines   mean {a['canary_mean']:+.5f}  std {a['canary_std']:.5f}",
                 f"  null cosines     mean {a['null_mean']:+.5f}  std {a['null_std']:.5f}",
                 f"  empirical ε  {_eps(emp)} at δ = {delta:g}: what the final model shows "
                 "(an estimate from below, with sampling error: not a proof)",
                 f"               {_eps(a['epsilon_empirical_equal_variance'])} with one "
                 "pooled variance (steadier, blind to a wider canary spread)",
                 f"  analytical ε {_eps(analytical)} at δ = {delta:g}: the accountant's "
                 "guarantee (summary.json)"]
    except (KeyError, TypeError, ValueError):
        raise ConfigError(path, "(its contents)", "the audit a run wrote") from None
    if _inf(emp) > _inf(analytical):
        lines.append("  the estimate exceeds the guarantee: the mechanism leaks more than its "
                     "accountant says, or the estimate is off by its sampling error (audit again "
                     "with more canaries)")
    else:
        lines.append("  the guarantee is at or above the estimate, as a correct accountant's "
                     "must be")
    return lines


def _inf(value) -> float:
    """A JSON ε: null is inf (strict JSON writes inf as null)."""
    return math.inf if value is None else float(value)


def _eps(value) -> str:
    return f"{_inf(value):.3f}"


def _read(path: str) -> dict:
    try:
        with open(path) as f:
            out = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(path, "(unreadable)", f"a JSON file the run wrote ({e})") from None
    if not isinstance(out, dict):
        raise ConfigError(path, "(its contents)", "a JSON object the run wrote")
    return out
