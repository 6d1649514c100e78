"""Every ε rayfl reports, recomputed independently: from dp-accounting's own events (no rayfl
code), and against a lower bound from a concrete pair of neighbouring datasets that no reported
ε may fall below. And nothing leaves a client under DP outside the account: a report beside the
noised update is refused, or declared public and then named in the ε's label."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld, rdp
from scipy.stats import norm

import rayfl
from rayfl import privacy
from tests.conftest import ROOT, TINY

DELTA = 1e-5
PLATEAU = "wrappers=[{name: examples.plateau:ReduceOnPlateau}]"
MECHANISMS = {  # name -> overrides of the tiny config (20 clients, 5 a round)
    "fixed": ["privacy.sampling=fixed"],
    "poisson": ["privacy.sampling=poisson"],
    "dp_ftrl": ["privacy.mechanism=dp_ftrl", "privacy.min_separation=2",
                "privacy.max_participations=1"],
    "banded_mf": ["privacy.mechanism=banded_mf", "privacy.min_separation=2",
                  "privacy.max_participations=2"],
}


# ----- an independent lower bound: the privacy loss of one concrete pair of datasets ---------
def _loss_masses(a: np.ndarray, b: np.ndarray, dy: float, h: float) -> tuple[int, np.ndarray]:
    """The distribution of the privacy loss log(a/b) under density a (on a grid of step dy),
    each loss rounded down to a multiple of h (so every δ computed from it is a lower bound)."""
    keep = (a > 0) & (b > 0)
    idx = np.floor((np.log(a[keep]) - np.log(b[keep])) / h).astype(np.int64)
    return int(idx.min()), np.bincount(idx - idx.min(), weights=a[keep] * dy)


def _composed(lo: int, mass: np.ndarray, rounds: int) -> tuple[int, np.ndarray]:
    """The loss distribution of ``rounds`` independent rounds (an FFT convolution power)."""
    n = len(mass) * rounds
    size = 1 << (n - 1).bit_length()
    out = np.fft.irfft(np.fft.rfft(mass, size) ** rounds, size)[:n - rounds + 1]
    return lo * rounds, np.clip(out, 0.0, None)


def _epsilon_at(lo: int, mass: np.ndarray, h: float, delta: float) -> float:
    """The ε whose hockey-stick divergence E[(1 − e^(ε − L))₊] is ``delta`` (bisection)."""
    losses = (lo + np.arange(len(mass))) * h
    keep = mass > 0
    losses, mass = losses[keep], mass[keep]

    def divergence(eps: float) -> float:
        return float(np.sum(mass * -np.expm1(np.minimum(eps - losses, 0.0))))

    lo_e, hi_e = 0.0, float(losses.max())
    if divergence(0.0) <= delta:
        return 0.0
    for _ in range(80):
        mid = (lo_e + hi_e) / 2
        lo_e, hi_e = (mid, hi_e) if divergence(mid) > delta else (lo_e, mid)
    return lo_e


def pair_epsilon(q: float, z: float, rounds: int, delta: float, shift: float) -> float:
    """ε of one pair of neighbouring datasets under the sampled Gaussian mechanism, both
    orders: every client's clipped update is +S·e; in the neighbour one client's is moved by
    ``shift``·S (2: switched to −S·e, replace-one; 1: removed, add-or-remove-one). Along e the
    round's noised sum is N(0, z²) against (1 − q)·N(0, z²) + q·N(−shift, z²) (units of S, the
    common mean dropped); the other coordinates have the same law under both."""
    y = np.linspace(-12 * z - shift, 12 * z + shift, 200_001)
    dy, h = y[1] - y[0], 2e-3
    p = norm.pdf(y, 0.0, z)
    m = (1 - q) * p + q * norm.pdf(y, -shift, z)
    return max(_epsilon_at(*_composed(*_loss_masses(a, b, dy, h), rounds), h, delta)
               for a, b in ((m, p), (p, m)))


def gaussian_pair_epsilon(mu: float, delta: float) -> float:
    """The exact ε of the Gaussian mechanism at sensitivity / noise = ``mu`` (Balle & Wang 2018,
    Theorem 8: δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ)), by bisection."""
    def d(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)

    lo, hi = 0.0, 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return lo


def test_the_pair_bound_is_exact_where_a_closed_form_exists():
    """With q = 1 the sampled mechanism is the Gaussian mechanism, whose exact ε is known: the
    numerical pair bound sits just below it (the rounding makes it a lower bound)."""
    for z, shift, rounds in ((1.0, 2.0, 1), (2.0, 1.0, 4)):
        exact = gaussian_pair_epsilon(shift * math.sqrt(rounds) / z, DELTA)
        assert exact - 0.02 <= pair_epsilon(1.0, z, rounds, DELTA, shift) <= exact


def test_fixed_size_sampling_is_accounted_for_replace_one_neighbours_at_half_the_multiplier():
    """12 rounds, 5 of 200 clients, z = 1: the sum's replace-one sensitivity is 2S."""
    n, k, z, rounds = 200, 5, 1.0, 12
    reported = privacy.epsilon(rounds, DELTA, "fixed", n, k, z)
    acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(
        n, k, dpa.GaussianDpEvent(z / 2)), rounds))
    assert reported == acc.get_epsilon(DELTA)
    bound = pair_epsilon(k / n, z, rounds, DELTA, shift=2.0)
    assert 6.0 < bound <= reported
    # the event at z (sensitivity S under replace-one) reports less than the pair shows
    wrong = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    wrong.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(
        n, k, dpa.GaussianDpEvent(z)), rounds))
    assert wrong.get_epsilon(DELTA) < 2.0 < bound


def test_the_privacy_how_tos_setting_gives_a_pair_far_above_the_old_epsilon_of_8():
    """6,000 clients, 200 a round, 100 rounds at z = 0.698 (once reported as ε = 8)."""
    n, k, z, rounds, delta = 6000, 200, 0.698, 100, 6.98e-5
    bound = pair_epsilon(k / n, z, rounds, delta, shift=2.0)
    assert bound > 30
    assert privacy.epsilon(rounds, delta, "fixed", n, k, z) >= bound


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_poisson_sampling_is_accounted_for_add_or_remove_neighbours(accountant):
    n, k, z, rounds = 200, 5, 1.0, 12
    reported = privacy.epsilon(rounds, DELTA, "poisson", n, k, z, accountant)
    acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant()
    acc.compose(dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(k / n, dpa.GaussianDpEvent(z)), rounds))
    assert reported == acc.get_epsilon(DELTA)
    assert pair_epsilon(k / n, z, rounds, DELTA, shift=1.0) <= reported


def _run(name: str, tiny: list[str], *extra: str):
    return rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "rounds=6",
                                   "privacy.noise_multiplier=2.0", "privacy.clip_norm=0.5",
                                   *MECHANISMS[name], *extra], quiet=True)


def _independent(name: str, rounds: int) -> float:
    """The run's ε from dp-accounting's events for its setting (20 clients, 5 a round)."""
    if name == "fixed":
        acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
        acc.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(
            20, 5, dpa.GaussianDpEvent(1.0)), rounds))
    elif name == "poisson":
        acc = rdp.RdpAccountant()
        acc.compose(dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(0.25, dpa.GaussianDpEvent(2.0)), rounds))
    elif name == "dp_ftrl":  # one participation: one leaf of one tree
        acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
        acc.compose(dpa.SingleEpochTreeAggregationDpEvent(2.0, rounds))
    else:  # two participations at least 2 rounds apart: two disjoint unit columns of C
        acc = rdp.RdpAccountant()
        acc.compose(dpa.GaussianDpEvent(2.0 / math.sqrt(2)))
    return acc.get_epsilon(DELTA)


def _pair_bound(name: str, rounds: int) -> float:
    if name in ("fixed", "poisson"):
        return pair_epsilon(0.25, 2.0, rounds, DELTA, 2.0 if name == "fixed" else 1.0)
    if name == "dp_ftrl":  # round 1's leaf lies in 1 + ⌊log₂ t⌋ released nodes
        return gaussian_pair_epsilon(math.sqrt(1 + math.floor(math.log2(rounds))) / 2.0,
                                     DELTA)
    return gaussian_pair_epsilon(math.sqrt(2) / 2.0, DELTA)


RELATION = {"fixed": "replace-one", "poisson": "add-or-remove-one", "dp_ftrl": "zero-out",
            "banded_mf": "zero-out"}


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_a_runs_epsilon_is_dp_accountings_and_above_a_neighbouring_pair(name, tiny):
    run = _run(name, tiny)
    eps = run.metrics.column("dp_epsilon").to_pylist()
    assert run.summary["epsilon"] == eps[-1] == pytest.approx(_independent(name, 6), rel=1e-12)
    assert eps[-1] >= _pair_bound(name, 6)
    stated = run.summary["privacy"]
    assert stated["neighbouring_relation"] == RELATION[name]
    assert stated["mechanism"] == ("dp_fedavg" if name in ("fixed", "poisson") else name)
    assert "seed" in stated["noise"] and stated["excludes_public_reports"] == []
    assert any("train_loss" in line for line in stated["outside_guarantee"])


def test_epsilon_samples_from_the_training_clients_only(tiny):
    """Validation clients are never sampled: the rate is 5 of the 16 that train, not of 20."""
    run = _run("poisson", tiny, "data.validation_clients=4")
    acc = rdp.RdpAccountant()
    acc.compose(dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(5 / 16, dpa.GaussianDpEvent(2.0)), 6))
    assert run.summary["epsilon"] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)
    assert run.summary["epsilon"] > _independent("poisson", 6)


# ----- nothing leaves a client outside the account -----------------------------------------
def _cli(args: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "rayfl", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_a_wrapper_reporting_client_losses_is_refused_under_every_mechanism(name, tmp_path):
    out_dir = tmp_path / "runs"
    done = _cli(["run", TINY, f"output_dir={out_dir}", f"data.cache_dir={tmp_path / 'cache'}",
                 "privacy.noise_multiplier=1.0", *MECHANISMS[name], PLATEAU], tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "examples.plateau:ReduceOnPlateau.client_apply" in lines[0]
    assert "'loss'" in lines[0] and "privacy.public_reports" in lines[0]
    assert not out_dir.exists()


def test_the_round_refuses_a_report_the_pre_flight_did_not_see(tiny, monkeypatch):
    """The server's own check, where no pre-flight ran (a built-in path, or a report sent only
    from round 2 on)."""
    from rayfl import preflight
    from rayfl.contract import ComponentError

    monkeypatch.setattr(preflight, "run", lambda cfg, parts: None)
    with pytest.raises(ComponentError, match="'loss'.*outside the privacy account"):
        _run("fixed", tiny, PLATEAU)


def test_a_report_declared_public_runs_and_epsilon_says_it_excludes_it(tiny):
    rows = []
    run = rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "rounds=2",
                                  "privacy.noise_multiplier=1.0", PLATEAU,
                                  "privacy.public_reports=[loss, weight]"],
                    quiet=True, on_round=lambda row: rows.append(row) and False)
    assert run.summary["privacy"]["excludes_public_reports"] == ["loss", "weight"]
    assert rows[-1]["dp_label"] == "replace-one, excludes loss, weight"
    assert run.metrics.column("plateau_loss").to_pylist()[0] > 0
    from rayfl.simulation import progress_line

    assert "ε " in progress_line(rows[-1]) and "excludes loss, weight" in progress_line(rows[-1])
    with open(os.path.join(run.run_dir, "summary.json")) as f:
        assert json.load(f)["privacy"]["neighbouring_relation"] == "replace-one"


def test_attackers_chosen_by_the_seed_are_no_client_report(tiny):
    """The attack transform's count of attackers is the seed's choice, not client data."""
    run = _run("fixed", tiny, "aggregation.transforms=[{name: attack, fraction: 0.5, "
                              "kind: sign_flip}]")
    assert run.summary["rounds"] == 6
