"""DP-FedAvg: clipping, the noise's scale, ε against the accountant library and an independent
computation, config rules, adaptive clipping, and a run end to end (target ε, resume)."""

from __future__ import annotations

import glob
import math
import os

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import rdp
from scipy import integrate

from rayfl import config as config_mod
from rayfl import privacy
import rayfl
from rayfl.algorithms.base import Aggregate, ClientTask, ServerRound
from rayfl.algorithms.fedavg import FedAvg
from rayfl.layers import ClientContext, Facts
from rayfl.rng import client_stream
from rayfl.runtime.context import ClientData
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from rayfl.runtime.state_store import STAMP
from rayfl.schema import ConfigError
from rayfl.transforms.dp import GaussianDP, GaussianDPParams, update_noise_multiplier
from tests.conftest import TINY
from tests.core_helpers import local_update

DT = torch.float64
D = 5


def test_every_client_contribution_is_clipped_and_the_mean_has_a_fixed_denominator():
    g = torch.Generator().manual_seed(1)
    cs = [quadratic_client(torch.rand(D, generator=g, dtype=DT) + 0.5,
                           5 * torch.randn(D, generator=g, dtype=DT)) for _ in range(6)]
    spec, lr, s, k = LocalSpec(steps=20, batch_size=1), 0.05, 0.4, 10
    chain = [GaussianDP(GaussianDPParams(noise_multiplier=0.0, clip_norm=s,
                                         expected_clients=k))]
    x0 = torch.zeros(D, dtype=DT)
    state, _, _ = simulate(FedAvg(weighting="uniform"), x0, cs, spec, rounds=1, lr0=lr,
                           transforms=chain)
    deltas = [local_update(FedAvg(), ClientTask(i, 0, lr, 1.0, {"x": x0}, None),
                           ClientData(c.n, c.grad_fn), spec, client_stream(0, 0, i))
              for i, c in enumerate(cs)]
    assert all(float(d.norm()) > s for d in deltas)
    clipped = [d * (s / float(d.norm())) for d in deltas]
    assert all(float(c.norm()) <= s * (1 + 1e-12) for c in clipped)
    # 6 clients took part but the denominator is the expected K = 10
    assert torch.allclose(state.x, x0 - sum(clipped) / k, rtol=1e-12, atol=1e-15)


def test_noise_has_standard_deviation_z_times_s_and_is_fixed_by_seed_and_round():
    z, s = 1.3, 0.5
    mech = GaussianDP(GaussianDPParams(noise_multiplier=z, clip_norm=s, expected_clients=4),
                      Facts(seed=7))
    noise = mech.noise(3, 400_000, s)
    assert abs(noise.std() / (z * s) - 1) < 0.005 and abs(noise.mean()) < 0.005
    assert np.array_equal(noise, mech.noise(3, 400_000, s))
    assert not np.array_equal(noise[:10], mech.noise(4, 10, s))


def _log_a_by_quadrature(q: float, z: float, a: float) -> float:
    """log E_{x~N(0,z²)}[((1 − q) + q e^{(2x − 1)/(2z²)})^a]: the Poisson-subsampled Gaussian's
    RDP moment (Mironov, Talwar & Zhang 2019) by numerical integration, not a series."""
    def log_f(x):
        return a * np.logaddexp(math.log1p(-q), math.log(q) + (2 * x - 1) / (2 * z * z)) \
            - x * x / (2 * z * z)

    lo, hi = -30 * z, a + 30 * z
    peak = max(log_f(x) for x in np.linspace(lo, hi, 2001))
    val, _ = integrate.quad(lambda x: math.exp(log_f(x) - peak), lo, hi,
                            points=[0.0, min(a, hi - 1)], limit=1000)
    return peak + math.log(val) - math.log(z * math.sqrt(2 * math.pi))


@pytest.mark.parametrize("q, z, rounds", [(0.01, 1.0, 1000), (0.05, 2.0, 500)])
def test_epsilon_is_the_libraries_and_matches_an_independent_computation(q, z, rounds):
    delta, n = 1e-5, 10_000
    ours = privacy.epsilon(rounds, delta, "poisson", n, int(round(q * n)), z)
    acc = rdp.RdpAccountant()
    acc.compose(dpa.SelfComposedDpEvent(
        dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), rounds))
    assert ours == acc.get_epsilon(delta)
    # RDP by quadrature, then the same RDP → (ε, δ) conversion, over the same orders
    best = min(rounds * _log_a_by_quadrature(q, z, a) / (a - 1) + math.log1p(-1 / a)
               - (math.log(delta) + math.log(a)) / (a - 1) for a in acc._orders)
    assert ours == pytest.approx(best, abs=0.005)


def test_epsilon_grows_with_rounds_and_target_bounds_them():
    kw = dict(delta=1e-5, sampling="fixed", num_clients=1000, per_round=10,
              noise_multiplier=1.0)
    eps = [privacy.epsilon(t, **kw) for t in (0, 1, 10, 100)]
    assert eps[0] == 0 and eps == sorted(eps) and eps[1] < eps[-1]
    t = privacy.rounds_within(eps[2] + 1e-9, 100, **kw)
    assert t == 10 or privacy.epsilon(t + 1, **kw) > eps[2]
    assert privacy.epsilon(t, **kw) <= eps[2] + 1e-9


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.name=scaffold"], "algorithm.name"),
    (["aggregation.weighting=samples"], "aggregation.weighting"),
    (["availability.model=bernoulli"], "availability.model"),
    (["availability.overcommit=1.5"], "availability.overcommit"),
    (["privacy.accountant=pld"], "privacy.accountant"),
    (["privacy.target_epsilon=0.001"], "privacy.target_epsilon"),
    (["privacy.delta=0"], "privacy.delta"),
])
def test_privacy_config_rules(overrides, key):
    base = ["privacy.noise_multiplier=1.0", "aggregation.weighting=uniform"]
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, base + overrides)
    assert e.value.key == key


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "adabest"])
def test_auto_weighting_under_privacy_is_uniform(name):
    """DP-FedAvg's fixed-denominator estimator weights every client 1: ``auto`` resolves to it
    (fedavg's and fedprox's paper weighting is samples, adabest's uniform)."""
    from rayfl.assemble import stack as build

    plain = config_mod.load(TINY, [f"algorithm.name={name}"])
    dp = config_mod.load(TINY, [f"algorithm.name={name}", "privacy.noise_multiplier=1.0"])
    assert dp.aggregation.weighting == plain.aggregation.weighting == "auto"
    assert build(plain, 20).algorithm.weighting == ("uniform" if name == "adabest" else "samples")
    assert build(dp, 20).algorithm.weighting == "uniform"


def test_dp_run_reports_epsilon_stops_at_target_and_resumes_identically(ray_local, tiny,
                                                                        tmp_path):
    common = tiny + ["rounds=6", "privacy.noise_multiplier=1.0", "privacy.clip_norm=0.5",
                     "privacy.sampling=poisson", "aggregation.weighting=uniform"]
    full = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True)  # Ray: below
    eps = full.metrics.column("dp_epsilon").to_pylist()
    assert eps == sorted(eps) and eps[0] > 0
    assert full.summary["epsilon"] == eps[-1] and full.summary["delta"] == 1e-5
    assert not full.summary["stopped_at_target_epsilon"]
    cfg = config_mod.load(TINY, common)
    assert eps == [privacy.accountant(cfg).epsilon(t + 1) for t in range(6)]
    capped = rayfl.run(TINY, common + [f"privacy.target_epsilon={eps[3] * (1 + 1e-9)}",
                                       "runtime.executor=inprocess"], quiet=True)
    assert capped.metrics.num_rows == 4 and capped.summary["stopped_at_target_epsilon"]
    run_dir = str(tmp_path / "paused")
    rayfl.run(TINY, common, run_dir=run_dir, quiet=True, max_rounds=3)
    resumed = rayfl.resume(run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == full.summary["model_sha256"]
    assert resumed.metrics.column("dp_epsilon").to_pylist() == eps


def _adaptive(gamma: float, clip: float = 1.0, k: int = 100, seed: int = 0) -> GaussianDP:
    return GaussianDP(GaussianDPParams(noise_multiplier=1.0, clip_norm=clip, expected_clients=k,
                                       target_quantile=gamma, clip_lr=0.2), Facts(seed=seed))


def _adaptive_round(mech: GaussianDP, slot, norms: np.ndarray, t: int, dim: int = 3):
    """One round of known update norms through the mechanism's client and server halves;
    returns its new server slot."""
    bc = mech.broadcast(slot, t)
    total, payload = torch.zeros(dim, dtype=DT), 0.0
    for i, r in enumerate(norms):
        ctx = ClientContext(t, i, broadcast=bc)
        total += mech.client_apply(torch.full((dim,), r / math.sqrt(dim), dtype=DT), t, i, ctx)
        payload += ctx.payload["unclipped"]
    agg = Aggregate(len(norms), len(norms), len(norms), float(len(norms)), total / len(norms),
                    total, 0.0, {})
    srv = ServerRound(t, torch.zeros(dim, dtype=DT), len(norms), None, None)
    return mech.aggregate(slot, agg, {"unclipped": payload}, srv)[1]


@pytest.mark.parametrize("gamma", [0.5, 0.9])
def test_adaptive_clip_norm_converges_to_the_target_quantile_of_known_norms(gamma):
    norms = np.linspace(1.0, 100.0, 100)  # the γ quantile of these is known exactly
    mech = _adaptive(gamma)
    slot = mech.init(None)
    assert mech.broadcast(slot, 0)["clip_norm"].item() == 1.0
    trace = []
    for t in range(400):
        slot = _adaptive_round(mech, slot, norms, t)
        trace.append(slot.value)
    late = np.array(trace[-100:])
    assert abs(np.median(late) / np.quantile(norms, gamma) - 1) < 0.1
    assert abs(np.mean(norms[None, :] <= late[:, None]) - gamma) < 0.05


def test_adaptive_clipping_costs_exactly_the_stated_noise_multiplier():
    z, sigma_b = 1.1, 2.5
    z_delta = update_noise_multiplier(z, sigma_b)
    assert z_delta > z
    # the update (sensitivity S, noise z_Δ S) and the count (sensitivity ½, noise σ_b) together
    both, one = rdp.RdpAccountant(), rdp.RdpAccountant()
    both.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_delta),
                                      dpa.GaussianDpEvent(2 * sigma_b)]))
    one.compose(dpa.GaussianDpEvent(z))
    assert both.get_epsilon(1e-5) == pytest.approx(one.get_epsilon(1e-5), rel=1e-9)
    mech = GaussianDP(GaussianDPParams(z, 0.5, 10, 0.5, 0.2, sigma_b), Facts(seed=1))
    noise = mech.noise(2, 400_000, 0.5)
    assert abs(noise.std() / (z_delta * 0.5) - 1) < 0.005


def test_adaptive_count_noise_must_leave_room_for_the_update_noise():
    with pytest.raises(ConfigError) as e:
        config_mod.load(TINY, ["privacy.noise_multiplier=1.0", "aggregation.weighting=uniform",
                               "privacy.adaptive_clip.count_noise=0.4"])
    assert e.value.key == "privacy.adaptive_clip.count_noise"


def test_resume_with_adaptive_clipping_and_error_feedback_gives_the_same_bytes_and_epsilon(
        ray_local, tiny, tmp_path):
    common = tiny + ["rounds=6", "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.05",
                     "privacy.sampling=poisson", "aggregation.weighting=uniform",
                     "privacy.adaptive_clip.target_quantile=0.5",
                     "privacy.adaptive_clip.count_noise=1.0",
                     "compression.method=topk", "compression.fraction=0.25",
                     "compression.error_feedback=true", "checkpoint.every=1"]
    full = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True)  # Ray: below
    clips = full.metrics.column("dp_clip_norm").to_pylist()
    assert clips[0] == 0.05 and len(set(clips)) == 6  # the clip norm moves every round
    run_dir = str(tmp_path / "paused")
    rayfl.run(TINY, common, run_dir=run_dir, quiet=True, max_rounds=3)
    resumed = rayfl.resume(run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == full.summary["model_sha256"]
    for key in ("dp_epsilon", "dp_clip_norm", "upload_bytes"):
        assert resumed.metrics.column(key).to_pylist() == full.metrics.column(key).to_pylist()
    assert resumed.summary["epsilon"] == full.summary["epsilon"]
    # fedavg keeps no client state of its own: the stored state is the top-k residual
    files = glob.glob(os.path.join(run_dir, "state", "*", "*.npz"))
    assert files and all({k for k in np.load(f).files if not k.startswith(STAMP)}
                         == {"layers.0.residual"} for f in files)  # besides the run's stamp


def test_a_dp_run_that_diverged_did_not_stop_at_its_target_epsilon(tiny):
    """Any run shorter than `rounds` said it had stopped at the ε target."""
    run = rayfl.run(TINY, tiny + ["runtime.executor=inprocess", "rounds=5",
                                  "privacy.noise_multiplier=1.0", "privacy.clip_norm=0.5",
                                  "aggregation.weighting=uniform", "loss_ceiling=0.001"],
                    quiet=True)
    assert run.summary["diverged_at_round"] == 1
    assert run.summary["stopped_at_target_epsilon"] is False
