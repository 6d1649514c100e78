"""The empirical privacy audit (one-shot estimation with canary clients): ε of two Gaussians
against closed forms and numerical integration, the canaries' directions and participation, the
estimate of a bare Gaussian mechanism against its ε; in runs of every mechanism the accountant's
ε above the estimate, a mechanism adding half the noise its accountant assumes caught, resume
giving the same audit, and the ``rayfl privacy audit`` command."""

from __future__ import annotations

import json
import math
import os

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import pld
from scipy import integrate
from scipy.stats import norm

import rayfl
from rayfl import cli, rng
from rayfl import config as config_mod
from rayfl.layers import Facts
from rayfl.privacy import audit
from rayfl.privacy.participation import Schema
from rayfl.transforms.dp import CorrelatedDP, GaussianDP
from tests.conftest import TINY
from tests.test_malformed import _refused, cache  # noqa: F401 (fixtures)

DELTA = 1e-5


# ----- ε of two Gaussians ---------------------------------------------------------------------
def _gaussian_delta(eps: float, mu: float) -> float:
    """The Gaussian mechanism's δ(ε) at sensitivity μ noise stds (Balle and Wang 2018)."""
    return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)


@pytest.mark.parametrize("mu", [0.2, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_equal_variances_give_the_gaussian_mechanisms_epsilon(mu, delta):
    scale, shift = 0.013, -0.4  # ε does not depend on the common scale or location
    eps = audit.epsilon_two_gaussians((shift, scale), (shift + mu * scale, scale), delta)
    assert _gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-6)
    assert audit.gaussian_mechanism_epsilon(mu, delta) == pytest.approx(eps, rel=1e-9)
    # the canary below the null: the same ε
    assert audit.epsilon_two_gaussians((shift + mu * scale, scale), (shift, scale), delta) == \
        pytest.approx(eps, rel=1e-9)


def test_the_gaussian_mechanisms_epsilon_is_dp_accountings():
    acc = pld.PLDAccountant()
    acc.compose(dpa.GaussianDpEvent(1.0))  # μ = 1
    assert audit.gaussian_mechanism_epsilon(1.0, DELTA) == pytest.approx(
        acc.get_epsilon(DELTA), rel=1e-3)


@pytest.mark.parametrize("p, q", [((0.0, 1.0), (0.5, 1.3)), ((0.2, 1.0), (0.0, 0.8)),
                                  ((0.0, 1.0), (0.0, 1.1)), ((1.0, 2.0), (-1.0, 1.5))])
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.5])
def test_unequal_variances_hockey_stick_is_the_integral(p, q, eps):
    def integral(a, b):
        f = lambda x: max(0.0, norm.pdf(x, *a) - math.exp(eps) * norm.pdf(x, *b))  # noqa: E731
        return integrate.quad(f, -40, 40, limit=800, points=[-5, -1, 0, 1, 5])[0]

    assert audit.hockey_stick(eps, p, q) == pytest.approx(integral(p, q), abs=1e-8)
    assert audit.hockey_stick(eps, q, p) == pytest.approx(integral(q, p), abs=1e-8)


def test_epsilon_of_two_gaussians_solves_the_curve_and_orders_as_it_should():
    assert audit.epsilon_two_gaussians((0.0, 1.0), (0.0, 1.0), DELTA) == 0.0
    p, q = (0.0, 1.0), (0.4, 1.2)
    eps = audit.epsilon_two_gaussians(p, q, DELTA)
    assert audit.delta_two_gaussians(eps, p, q) == pytest.approx(DELTA, rel=1e-6)
    # a wider canary spread alone costs privacy; more separation costs more
    assert audit.epsilon_two_gaussians((0.0, 1.0), (0.0, 1.1), DELTA) > 0.5
    assert audit.epsilon_two_gaussians(p, (0.8, 1.2), DELTA) > eps
    assert audit.epsilon_two_gaussians(p, q, 1e-3) < eps
    assert audit.epsilon_two_gaussians((0.1, 0.0), q, DELTA) == math.inf  # a point mass
    assert audit.epsilon_two_gaussians((0.1, 0.0), (0.1, 0.0), DELTA) == 0.0
    with pytest.raises(ValueError, match="stds ≥ 0"):
        audit.epsilon_two_gaussians((0.0, -1.0), q, DELTA)
    still = audit.Estimate.of(np.zeros(4), np.zeros(4), DELTA)  # a model that never moved
    assert still.epsilon == still.epsilon_equal_variance == 0.0


# ----- canaries -------------------------------------------------------------------------------
def test_directions_are_unit_seeded_and_inserted_apart_from_null():
    d = 5000
    c = np.stack([audit.direction(3, j, d) for j in range(200)])
    n = np.stack([audit.direction(3, j, d, inserted=False) for j in range(200)])
    assert np.allclose(np.linalg.norm(c, axis=1), 1.0) and np.allclose(
        np.linalg.norm(n, axis=1), 1.0)
    assert np.array_equal(c[7], audit.direction(3, 7, d))
    assert not np.allclose(c[7], audit.direction(4, 7, d))
    cos = (c @ n.T).ravel()  # independent uniform directions: cosine ≈ N(0, 1/d)
    assert abs(cos.mean()) < 3 / math.sqrt(d * cos.size)
    assert cos.std() * math.sqrt(d) == pytest.approx(1.0, abs=0.03)
    assert audit.cosines(np.zeros(d), 3, 5, True).tolist() == [0.0] * 5
    assert audit.cosines(c[2] * 7.0, 3, 3, True)[2] == pytest.approx(1.0)


def test_schedule_takes_each_canary_at_the_rate_within_the_schema():
    free = audit.schedule(seed=1, count=400, rounds=50, rate=0.2)
    assert free.shape == (50, 400) and np.array_equal(
        free, audit.schedule(seed=1, count=400, rounds=50, rate=0.2))
    assert free.mean() == pytest.approx(0.2, abs=0.01)
    assert np.array_equal(free[7], rng.stream(1, 7, rng.AUDIT_SAMPLE).random(400) < 0.2)
    bounded = audit.schedule(seed=1, count=400, rounds=50, rate=0.2, schema=Schema(3, 4))
    assert bounded.sum(axis=0).max() == 4
    for j in range(400):
        rounds = np.flatnonzero(bounded[:, j])
        assert np.all(np.diff(rounds) >= 3)
    assert np.all(bounded <= free)  # the schema only removes participations


def test_canaries_follow_the_privacy_section():
    facts = Facts(seed=5, rounds=6, clients_per_round=5, num_clients=20)
    plain = config_mod.load(TINY, ["privacy.noise_multiplier=1.0"]).privacy
    assert audit.Canaries.of(plain, facts) is None
    assert GaussianDP.of(plain, facts).canaries is None  # no audit: the layer as before
    on = config_mod.load(TINY, ["privacy.noise_multiplier=1.0",
                                "privacy.audit_canaries=30"]).privacy
    canaries = GaussianDP.of(on, facts).canaries
    assert canaries == audit.Canaries(5, 30, 6, 0.25, None)
    ftrl = config_mod.load(TINY, ["privacy.mechanism=dp_ftrl", "privacy.min_separation=2",
                                  "privacy.audit_canaries=30"]).privacy
    mech = GaussianDP.of(ftrl, facts)
    assert isinstance(mech, CorrelatedDP) and mech.canaries.schema == Schema(2, None)
    total = canaries.round_sum(2, 50, clip=0.5)
    want = sum(audit.direction(5, int(j), 50) for j in np.flatnonzero(canaries.taking_part[2]))
    assert np.allclose(total, 0.5 * want)


def test_a_gaussian_mechanisms_estimate_is_near_its_epsilon():
    """Canaries inserted once into y = Σ c_j + N(0, σ²I): canary cosines ≈ N(μ/√d, 1/d),
    μ = 1/σ (shrunk by the canaries' own share of ‖y‖), null ≈ N(0, 1/d). With 1000 canaries
    μ's estimate has a standard error of about 4 % and the fitted stds' ratio about 3 %, which
    moves the two-variance ε at δ = 1e-5 by tens of per cent; the pooled one moves less (bounds
    here: about three standard errors)."""
    d, k, sigma = 20000, 1000, 1.0
    y = rng.stream(0, 99).standard_normal(d) * sigma
    for j in range(k):
        y += audit.direction(0, j, d)
    est = audit.Estimate.of(audit.cosines(y, 0, k, True), audit.cosines(y, 0, k, False), DELTA)
    mu = 1 / sigma / math.sqrt(1 + k / (d * sigma ** 2))
    assert (est.canary_mean - est.null_mean) / est.null_std == pytest.approx(mu, rel=0.12)
    assert est.null_std * math.sqrt(d) == pytest.approx(1.0, rel=0.07)
    assert est.canary_std / est.null_std == pytest.approx(1.0, abs=0.1)
    want = audit.gaussian_mechanism_epsilon(mu, DELTA)
    assert est.epsilon_equal_variance == pytest.approx(want, rel=0.2)
    assert 0.75 * want < est.epsilon < 1.6 * want


# ----- runs -----------------------------------------------------------------------------------
# d = 5 · 1000 + 5 = 5005 parameters; 500 canaries and 500 null directions; 5 rounds
COMMON = ["data.features=1000", "data.classes=5", "rounds=5", "eval.every=5",
          "privacy.clip_norm=0.5", "privacy.noise_multiplier=1.0", "privacy.audit_canaries=500",
          "aggregation.weighting=uniform", "runtime.executor=inprocess"]
MECHANISMS = {"dp_fedavg fixed": [],
              "dp_fedavg poisson": ["privacy.sampling=poisson", "clients_per_round=2"],
              "dp_ftrl": ["privacy.mechanism=dp_ftrl"],
              "banded_mf": ["privacy.mechanism=banded_mf", "privacy.bands=2"]}


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """name -> the run of that mechanism (each run once for the module)."""
    root = tmp_path_factory.mktemp("audit")
    done = {}

    def run(name: str):
        if name not in done:
            done[name] = rayfl.run(TINY, [f"output_dir={root / 'runs'}",
                                          f"data.cache_dir={root / 'cache'}", *COMMON,
                                          *MECHANISMS[name]], quiet=True)
        return done[name]

    return run


def _audit(run) -> dict:
    with open(os.path.join(run.run_dir, audit.FILE)) as f:
        return json.load(f)


@pytest.mark.parametrize("name", MECHANISMS)
def test_the_accountants_epsilon_is_above_the_estimate(name, audited):
    run = audited(name)
    a = _audit(run)
    assert a["epsilon"] == run.summary["epsilon"]
    assert run.summary["privacy_audit"] == {"canaries": 500,
                                            "epsilon_empirical": a["epsilon_empirical"]}
    assert 0 < a["epsilon_empirical"] < a["epsilon"]
    assert 0 < a["epsilon_empirical_equal_variance"] <= a["epsilon_empirical"]
    assert a["dimension"] == 5005 and a["rounds"] == 5 and a["delta"] == DELTA
    assert len(a["canary_cosines"]) == len(a["null_cosines"]) == 500
    assert a["canary_mean"] == pytest.approx(np.mean(a["canary_cosines"]))
    cfg = config_mod.load(TINY, COMMON + MECHANISMS[name])
    canaries = audit.Canaries.of(cfg.privacy, Facts(0, 5, cfg.clients_per_round, 20))
    assert a["participations"] == canaries.taking_part.sum(axis=0).tolist()
    if name in ("dp_ftrl", "banded_mf"):  # within the schema the accountant assumes
        bound = canaries.schema.bound(5)
        assert max(a["participations"]) <= bound <= run.summary["participation"][
            "max_participations"]


def test_half_the_noise_the_accountant_assumes_is_caught(tmp_path, tiny, monkeypatch):
    """Every client and canary in every round (Poisson rate 1): the accountant assumes z = 2,
    the layer adds noise of z = 1; the estimate lands above the accountant's ε."""
    half = GaussianDP.noise
    monkeypatch.setattr(GaussianDP, "noise", lambda self, t, dim, clip:
                        half(self, t, dim, clip) / 2)
    run = rayfl.run(TINY, tiny + COMMON + ["privacy.noise_multiplier=2.0",
                                           "privacy.sampling=poisson", "clients_per_round=20"],
                    quiet=True)
    a = _audit(run)
    assert a["epsilon_empirical"] > a["epsilon"] == run.summary["epsilon"]
    assert a["epsilon_empirical_equal_variance"] > a["epsilon"]
    assert set(a["participations"]) == {5}


def test_a_resumed_run_gives_the_same_model_and_audit(audited, tmp_path, tiny):
    full = audited("dp_fedavg fixed")
    run_dir = str(tmp_path / "paused")
    rayfl.run(TINY, tiny + COMMON, run_dir=run_dir, quiet=True, max_rounds=2)
    assert not os.path.exists(os.path.join(run_dir, audit.FILE))  # written when it finishes
    resumed = rayfl.resume(run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == full.summary["model_sha256"]
    assert _audit(resumed) == _audit(full)


def test_the_audit_command_prints_both_epsilons(audited, capsys):
    run = audited("dp_fedavg fixed")
    a = _audit(run)
    assert cli.main(["privacy", "audit", run.run_dir]) == 0
    out = capsys.readouterr().out
    assert f"empirical ε  {a['epsilon_empirical']:.3f} at δ = 1e-05" in out
    assert f"analytical ε {run.summary['epsilon']:.3f} at δ = 1e-05" in out
    assert "500 canaries and 500 null directions, 5 rounds, model dimension 5005" in out
    assert "the guarantee is at or above the estimate" in out


def test_the_audit_command_refuses_what_is_no_audited_run(tmp_path, capsys, cache):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.yaml").write_text("name: tiny\n")
    _refused(["privacy", "audit", str(plain)], "privacy.audit_canaries > 0", tmp_path, capsys,
             cache, run_dir=str(plain))
    _refused(["privacy", "audit", str(tmp_path / "none")], "a run directory", tmp_path, capsys,
             cache)
    (plain / audit.FILE).write_text("{not json")
    _refused(["privacy", "audit", str(plain)], audit.FILE, tmp_path, capsys, cache,
             run_dir=str(plain))
    (plain / audit.FILE).write_text('{"canaries": 3}')
    _refused(["privacy", "audit", str(plain)], audit.FILE, tmp_path, capsys, cache,
             run_dir=str(plain))


@pytest.mark.parametrize("value", ["1", "-1", "2.5"])
def test_audit_canaries_must_be_none_or_at_least_two(value, tmp_path, capsys, cache, no_ray):
    _refused(["run", TINY, "privacy.noise_multiplier=1.0", f"privacy.audit_canaries={value}"],
             "privacy.audit_canaries", tmp_path, capsys, cache)
