"""DP-FTRL's tree aggregation and banded matrix factorisation: their noise against hand
computations, closed forms and the noise's covariance over seeds; ε against dp-accounting
computed here from the same events; the participation bound audited from runs' records, across
resume and fork, under realistic availability; no noise gives DP-FedAvg's bytes; every misuse of
the new keys refused with its reason."""

from __future__ import annotations

import itertools
import math
import os

import dp_accounting as dpa
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from dp_accounting import pld, rdp
from scipy.special import binom

import rayfl
from rayfl import config as config_mod
from rayfl import privacy
from rayfl.algorithms.base import Aggregate
from rayfl.fork import fork
from rayfl.privacy import banded, tree
from rayfl.privacy.participation import Participation, Schema
from rayfl.runtime import checkpoint
from rayfl.selection import Selector
from rayfl.algorithms.base import ServerRound
from rayfl.layers import Facts
from rayfl.transforms.dp import CorrelatedDP, GaussianDP, GaussianDPParams
from tests.conftest import TINY
from tests.test_malformed import _refused, cache  # noqa: F401 (fixtures)

# ----- tree aggregation -------------------------------------------------------------------


def _rounds(source, n: int, dim: int) -> np.ndarray:
    """The noise the first n rounds receive, one row a round."""
    return np.stack([source.round_noise(t, dim) for t in range(n)])


def test_a_small_trees_noise_equals_the_hand_computation():
    dim = 3
    gen = tree.TreeNoise(seed=3)
    z = {(h, i): gen.node(0, h, i, dim) for h in range(3) for i in range(8)}
    # prefix noises n_t from the binary digits of t + 1: [0], [0,1], [0,1]+[2], [0..3], ...
    prefix = [z[0, 0], z[1, 0], z[1, 0] + z[0, 2], z[2, 0], z[2, 0] + z[0, 4],
              z[2, 0] + z[1, 2], z[2, 0] + z[1, 2] + z[0, 6]]
    want = np.diff(np.stack([np.zeros(dim)] + prefix), axis=0)
    assert np.allclose(_rounds(gen, 7, dim), want, rtol=0, atol=1e-12)

    restarted = tree.TreeNoise(seed=3, restart=3)  # trees of rounds 0–2, 3–5, 6–
    y = {(k, h, i): restarted.node(k, h, i, dim) for k in range(3) for h in range(2)
         for i in range(3)}
    want = [y[0, 0, 0], y[0, 1, 0] - y[0, 0, 0], y[0, 0, 2],  # n: [0], [0,1], [0,1]+[2]
            y[1, 0, 0], y[1, 1, 0] - y[1, 0, 0], y[1, 0, 2],  # a fresh tree: n_{-1} = 0
            y[2, 0, 0]]
    assert np.allclose(_rounds(restarted, 7, dim), np.stack(want), rtol=0, atol=1e-12)


def test_honakers_estimator_by_hand():
    dim = 2
    gen = tree.TreeNoise(seed=5, honaker=True)
    z = {(h, i): gen.node(0, h, i, dim) for h in range(3) for i in range(4)}
    # v_1 = (1 + 1/2)^-1 = 2/3 = w_1; v_2 = (1 + 1/(2·2/3))^-1 = 4/7 = w_2
    s10 = 2 / 3 * z[1, 0] + 1 / 3 * (z[0, 0] + z[0, 1])
    s11 = 2 / 3 * z[1, 1] + 1 / 3 * (z[0, 2] + z[0, 3])
    prefix = [z[0, 0], s10, s10 + z[0, 2], 4 / 7 * z[2, 0] + 3 / 7 * (s10 + s11)]
    got = np.cumsum(_rounds(gen, 4, dim), axis=0)
    assert np.allclose(got, np.stack(prefix), rtol=0, atol=1e-12)


def _incidence(horizon: int, restart: int | None = None) -> tuple[list, np.ndarray]:
    """The nodes released within ``horizon`` rounds and their (node × round) 0/1 matrix."""
    nodes = tree.complete_nodes(horizon, restart)
    h = np.zeros((len(nodes), horizon))
    for row, (_, _, start, end) in enumerate(nodes):
        h[row, start:end] = 1
    return nodes, h


def _prefix_weights(n: int, restart: int | None, honaker: bool) -> np.ndarray:
    """Row t: the weights of the node noises in the noise the model holds after round t.

    Plain: the maximal complete nodes of the current tree tiling its rounds so far, plus each
    earlier tree's full tiling. Honaker: the least-squares (BLUE) estimate of those sums from
    every node released by then, computed with a pseudo-inverse, not the recursion."""
    nodes, _ = _incidence(n, restart)
    index = {node[:3]: i for i, node in enumerate(nodes)}
    size = n if restart is None else restart
    out = np.zeros((n, len(nodes)))
    for t in range(n):
        first = t - t % size
        for start, end in [(s, min(s + size, t + 1)) for s in range(0, first + 1, size)]:
            released = [i for i, (k, _, a, b) in enumerate(nodes)
                        if k == start // size and b <= end]
            if honaker:
                h = np.zeros((len(released), end - start))
                for row, i in enumerate(released):
                    h[row, nodes[i][2] - start:nodes[i][3] - start] = 1
                out[t, released] += np.ones(end - start) @ np.linalg.pinv(h)
            else:  # the binary digits of the rounds so far
                pos = start
                for level in reversed(range(64)):
                    if pos + 2 ** level <= end and (pos - start) % 2 ** level == 0:
                        out[t, index[start // size, level, pos]] = 1
                        pos += 2 ** level
    return out


@pytest.mark.parametrize("restart, honaker", [(None, False), (None, True), (3, False),
                                              (4, True)])
def test_the_tree_noise_is_its_nodes_times_the_estimator_weights(restart, honaker):
    n, dim = 11, 4
    gen = tree.TreeNoise(seed=11, restart=restart, honaker=honaker)
    got = np.cumsum(_rounds(gen, n, dim), axis=0)
    nodes, _ = _incidence(n, restart)
    z = np.stack([gen.node(k, h, start >> h if restart is None else (start % restart) >> h,
                           dim) for k, h, start, _ in nodes])
    assert np.allclose(got, _prefix_weights(n, restart, honaker) @ z, rtol=0, atol=1e-10)


def _empirical_covariance(make, n: int, seeds: int = 20, dim: int = 2500) -> np.ndarray:
    """The covariance across rounds of the noise the rounds receive, over seeds (and the
    coordinates, which are independent draws)."""
    samples = np.concatenate([_rounds(make(seed), n, dim) for seed in range(seeds)], axis=1)
    return samples @ samples.T / samples.shape[1]


@pytest.mark.parametrize("restart, honaker", [(None, False), (None, True), (3, True)])
def test_tree_noise_covariance_across_rounds_equals_the_analytic_one(restart, honaker):
    n = 8
    emp = _empirical_covariance(lambda s: tree.TreeNoise(s, restart, honaker), n)
    d = np.eye(n) - np.eye(n, k=-1)  # round noise = n_t − n_{t−1}
    w = d @ _prefix_weights(n, restart, honaker)
    analytic = w @ w.T
    assert np.abs(emp - analytic).max() < 0.05
    assert np.abs(analytic - np.diag(np.diag(analytic))).max() > 0.3  # correlated rounds


def test_the_tree_state_is_its_decomposition_and_continues_to_the_same_bytes():
    a, b = tree.TreeNoise(2, None, True), tree.TreeNoise(2, None, True)
    first = _rounds(a, 11, 5)
    for t in range(6):
        b.round_noise(t, 5)
    state = b.state()
    assert state["levels"] == [2, 1]  # rounds 0..5: nodes [0, 4) and [4, 6)
    c = tree.TreeNoise(2, None, True)
    c.load_state(state)
    assert np.array_equal(np.stack([c.round_noise(t, 5) for t in range(6, 11)]), first[6:])
    with pytest.raises(ValueError):
        c.round_noise(3, 5)


def _brute_tree(n: int, b: int, k: int, restart: int | None) -> int:
    """max over rounds π (≤ k, consecutive ≥ b apart) of Σ_ν |π ∩ ν|², by enumeration."""
    nodes = tree.complete_nodes(n, restart)
    best = 0
    for m in range(1, k + 1):
        for pi in itertools.combinations(range(n), m):
            if all(y - x >= b for x, y in itertools.pairwise(pi)):
                best = max(best, sum(sum(s <= t < e for t in pi) ** 2 for *_, s, e in nodes))
    return best


def test_the_tree_sensitivity_bounds_every_participation_pattern():
    tight = loose = 0
    for n, b, k, restart in itertools.product(range(1, 12), (1, 2, 3), (1, 2, 3),
                                              (None, 2, 4)):
        exact = _brute_tree(n, b, k, restart)
        bound = tree.max_sensitivity_squared(n, b, k, restart)
        assert bound >= exact, (n, b, k, restart)
        if k == 1:  # one leaf: the most nodes a round is in
            assert bound == exact == tree.depth(n if restart is None else min(restart, n))
        if restart is not None and restart <= b:  # one leaf a tree: within the tree event's
            assert bound <= Schema(b, k).bound(n) * tree.depth(min(restart, n))
        tight, loose = tight + (bound == exact), loose + (bound > exact)
    assert tight > 10 * loose  # the relaxation rarely loses anything


def test_a_clients_own_tree_sensitivity_counts_its_nodes():
    nodes = tree.complete_nodes(10, None)
    pi = np.array([1, 4, 9])
    want = sum(sum(s <= t < e for t in pi) ** 2 for *_, s, e in nodes)
    assert tree.sensitivity_squared(pi, 10) == want
    assert tree.sensitivity_squared(pi, 9) == sum(
        sum(s <= t < e for t in pi[:2]) ** 2 for *_, s, e in tree.complete_nodes(9, None))
    assert tree.sensitivity_squared(np.array([0]), 8) == tree.depth(8) == 4


# ----- banded matrix factorisation --------------------------------------------------------


def test_square_root_bands_are_the_binomial_series_and_square_to_the_prefix_sums():
    n = 40
    c = banded.sqrt_coefficients(n)
    j = np.arange(n)
    assert np.allclose(c, binom(2 * j, j) / 4.0 ** j, rtol=1e-12)
    full = banded.toeplitz(c, n)
    assert np.allclose(full @ full, np.tril(np.ones((n, n))), atol=1e-12)  # A = C·C


@pytest.mark.parametrize("bands, method", [(1, "sqrt"), (4, "sqrt"), (4, "optimized"),
                                           (12, "optimized")])
def test_banded_factorisation_and_its_closed_form_error(bands, method):
    n = 12
    c = banded.coefficients(bands, method, n)
    C = banded.toeplitz(c, n)
    assert np.isclose(np.linalg.norm(c), 1.0) and np.all(np.linalg.norm(C, axis=0) <= 1 + 1e-12)
    assert np.all(np.triu(C, 1) == 0) and np.all(np.tril(C, -bands) == 0)  # b-banded
    A = np.tril(np.ones((n, n)))
    B = A @ np.linalg.inv(C)
    assert np.allclose(B @ C, A, atol=1e-10)
    assert np.isclose(banded.prefix_error(c, n), (B ** 2).sum(), rtol=1e-10)
    # the generator's noise: C w = Z, and its prefix sums err by ‖B‖_F² per coordinate
    dim = 20_000
    gen = banded.BandedNoise(seed=4, coefficients=c)
    w = _rounds(gen, n, dim)
    z = np.stack([gen.z(t, dim) for t in range(n)])
    assert np.allclose(C @ w, z, atol=1e-9)
    mc = (np.cumsum(w, axis=0) ** 2).sum(axis=0).mean()
    assert abs(mc / (B ** 2).sum() - 1) < 0.03


def test_banded_noise_covariance_across_rounds_equals_the_analytic_one():
    n, c = 8, banded.coefficients(3, "sqrt")
    emp = _empirical_covariance(lambda s: banded.BandedNoise(s, c), n)
    inv = np.linalg.inv(banded.toeplitz(c, n))
    assert np.abs(emp - inv @ inv.T).max() < 0.05


def test_optimized_bands_beat_the_square_root_and_follow_the_gradient():
    for bands, n in ((2, 20), (5, 50), (16, 200)):
        c = banded.coefficients(bands, "optimized", n)
        assert banded.prefix_error(c, n) < banded.prefix_error(banded.coefficients(bands, "sqrt"),
                                                               n)
        # c(x) has no root in the unit disc: C⁻¹'s recurrence stays stable past the horizon
        assert np.abs(np.roots(c[::-1])).min() > 1
    c, eps = banded.sqrt_coefficients(5) + 0.1, 1e-6
    _, grad = banded._loss_and_gradient(c, 30)
    numeric = [(banded.prefix_error(c + eps * e, 30) - banded.prefix_error(c - eps * e, 30))
               / (2 * eps) for e in np.eye(5)]
    assert np.allclose(grad, numeric, rtol=1e-5)


def test_columns_of_a_banded_c_at_least_b_apart_never_overlap():
    """So a client's k participations b apart have sensitivity² Σ ‖C[:, t]‖² ≤ k, whatever
    directions its updates take (checked over every pattern of a small horizon)."""
    n, b = 10, 3
    C = banded.toeplitz(banded.coefficients(b, "optimized", n), n)
    gram = C.T @ C
    for k in (1, 2, 3, 4):
        worst = 0.0
        for m in range(1, k + 1):
            for pi in itertools.combinations(range(n), m):
                if all(y - x >= b for x, y in itertools.pairwise(pi)):
                    block = gram[np.ix_(pi, pi)]
                    assert np.allclose(block, np.diag(np.diag(block)))
                    worst = max(worst, np.trace(block))
        assert worst <= min(k, math.ceil(n / b)) + 1e-12
        assert worst == pytest.approx(min(k, math.ceil(n / b)) if k * b <= n else worst)


# ----- accounting --------------------------------------------------------------------------


def _cfg(*overrides):
    return config_mod.load(TINY, ["privacy.noise_multiplier=2.0", *overrides])


def _epsilon_of(event, delta=1e-5, relation=None):
    acc = rdp.RdpAccountant(**({} if relation is None else {"neighboring_relation": relation}))
    acc.compose(event)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("overrides, steps, count", [
    (["privacy.max_participations=1"], 4, 1),  # one tree of 4 rounds, one leaf
    (["rounds=12", "privacy.min_separation=3", "privacy.restart=3"], 3, 4),  # a tree each
    (["rounds=12", "privacy.min_separation=4", "privacy.restart=2",
      "privacy.max_participations=2"], 2, 2)])
def test_dp_ftrl_epsilon_is_dp_accountings_tree_aggregation_event(overrides, steps, count):
    cfg = _cfg("privacy.mechanism=dp_ftrl", *overrides)
    event = dpa.SelfComposedDpEvent(dpa.SingleEpochTreeAggregationDpEvent(2.0, steps), count)
    want = _epsilon_of(event, relation=dpa.NeighboringRelation.REPLACE_SPECIAL)
    acc = privacy.accountant(cfg)
    assert acc.epsilon(cfg.rounds) == want
    # the same guarantee through the Gaussian mechanism with the tree's sensitivity
    schema = privacy.schema_of(cfg.privacy)
    s2 = tree.max_sensitivity_squared(cfg.rounds, schema.min_separation,
                                      schema.max_participations, cfg.privacy.restart)
    assert s2 == count * tree.depth(steps)
    assert acc.gaussian_epsilon(s2) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_dp_ftrl_epsilon_with_several_leaves_a_tree_is_the_gaussian_of_the_brute_force(
        accountant):
    cfg = _cfg("privacy.mechanism=dp_ftrl", "rounds=9", "privacy.min_separation=2",
               "privacy.max_participations=3", f"privacy.accountant={accountant}")
    s2 = _brute_tree(9, 2, 3, None)
    event = dpa.GaussianDpEvent(2.0 / math.sqrt(s2))
    if accountant == "rdp":
        want = _epsilon_of(event)
    else:
        acc = pld.PLDAccountant()
        acc.compose(event)
        want = acc.get_epsilon(1e-5)
    assert privacy.accountant(cfg).epsilon(9) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("rounds, b, k", [(12, 3, None), (12, 3, 2), (10, 4, None)])
def test_banded_epsilon_is_the_gaussian_mechanism_at_its_sensitivity(rounds, b, k):
    extra = [] if k is None else [f"privacy.max_participations={k}"]
    cfg = _cfg("privacy.mechanism=banded_mf", f"rounds={rounds}", f"privacy.min_separation={b}",
               *extra)
    m = math.ceil(rounds / b) if k is None else min(k, math.ceil(rounds / b))
    assert privacy.accountant(cfg).epsilon(rounds) == _epsilon_of(
        dpa.GaussianDpEvent(2.0 / math.sqrt(m)))
    assert privacy.accountant(cfg).epsilon(0) == 0.0


def test_individual_epsilon_follows_a_clients_own_rounds():
    cfg = _cfg("privacy.mechanism=dp_ftrl", "rounds=8", "privacy.min_separation=2")
    acc = privacy.accountant(cfg)
    eps = acc.individual([np.array([0]), np.array([1, 5]), np.array([0, 2, 4, 6])], 8)
    for e, pi in zip(eps, ([0], [1, 5], [0, 2, 4, 6])):
        s2 = tree.sensitivity_squared(np.array(pi), 8)
        assert e == _epsilon_of(dpa.GaussianDpEvent(2.0 / math.sqrt(s2)))
    assert eps[0] < eps[1] < eps[2] <= acc.epsilon(8) + 1e-12
    banded_acc = privacy.accountant(_cfg("privacy.mechanism=banded_mf", "rounds=8",
                                         "privacy.bands=2"))
    assert banded_acc.individual([np.array([0, 3, 6])], 8)[0] == _epsilon_of(
        dpa.GaussianDpEvent(2.0 / math.sqrt(3)))


@pytest.mark.parametrize("mechanism", ["dp_ftrl", "banded_mf"])
def test_calibrated_noise_reaches_the_target_and_no_less_would(mechanism):
    cfg = _cfg(f"privacy.mechanism={mechanism}", "rounds=20", "privacy.min_separation=4")
    z = privacy.calibrate(cfg, 3.0)
    assert privacy.accountant(cfg, z).epsilon(20) <= 3.0 < \
        privacy.accountant(cfg, z * (1 - 1e-3)).epsilon(20)


# ----- the transform and the participation record --------------------------------------------


def test_with_no_noise_the_mechanisms_add_nothing_to_dp_fedavgs_clipped_sum():
    total = torch.randn(50, dtype=torch.float64)
    agg = Aggregate(5, 5, 20, 5.0, total / 5, total, 1.0, {})
    params = GaussianDPParams(noise_multiplier=0.0, clip_norm=0.5, expected_clients=10)
    srv = ServerRound(0, total, 20, None, None)
    plain = GaussianDP(params, Facts(seed=1))
    want = plain.aggregate(plain.init(total), agg, {}, srv)[0]
    for source in (tree.TreeNoise(1, None, True), banded.BandedNoise(
            1, banded.coefficients(3, "optimized", 10))):
        mech = CorrelatedDP(params, Facts(seed=1), source)
        got, slot, _ = mech.aggregate(mech.init(total), agg, {}, srv)
        assert torch.equal(got.delta_sum, want.delta_sum)
        assert torch.equal(got.delta_mean, want.delta_mean)
        assert slot["next_round"] == 1  # the generator moved on a round, in the slot


def test_eligibility_and_the_record():
    p = Participation(6, Schema(min_separation=2, max_participations=2))
    assert p.eligible(0).all()
    p.record(0, np.array([0, 1]))
    assert p.eligible(1).tolist() == [False, False, True, True, True, True]
    p.record(1, np.array([2]))
    p.record(2, np.array([0, 3]))
    assert p.eligible(3).tolist() == [False, True, True, False, True, True]  # 0: k reached
    q = Participation(6, p.schema)
    q.load_state(p.state())
    assert np.array_equal(q.count, p.count) and np.array_equal(q.last, p.last)
    ids, rounds = q.by_client()
    assert ids.tolist() == [0, 1, 2, 3] and [r.tolist() for r in rounds] == [[0, 2], [0], [1],
                                                                              [2]]
    assert Schema(3, None).bound(10) == 4 and Schema(3, 2).bound(10) == 2


def _audit(run_dir: str, b: int, k: int | None, rounds: int) -> list[dict]:
    """participation.parquet checked against the schema and against metrics.parquet."""
    rows = pq.read_table(os.path.join(run_dir, "participation.parquet")).to_pylist()
    for r in rows:
        assert r["participations"] == len(r["rounds"]) and r["rounds"] == sorted(r["rounds"])
        assert all(y - x >= b for x, y in zip(r["rounds"], r["rounds"][1:])), r
        assert k is None or r["participations"] <= k
        assert all(1 <= t <= rounds for t in r["rounds"])
    metrics = pq.read_table(os.path.join(run_dir, "metrics.parquet")).to_pylist()
    per_round = np.bincount([t for r in rows for t in r["rounds"]], minlength=rounds + 1)[1:]
    assert per_round.tolist() == [m["completed"] for m in metrics]
    assert all(m["completed"] <= m["sampled"] <= m["eligible"] <= m["online"] for m in metrics)
    return rows


def _run(tiny, *overrides, ray: bool = False, **kw):
    where = [] if ray else ["runtime.executor=inprocess"]
    return rayfl.run(TINY, tiny + where + ["privacy.clip_norm=0.5", *overrides], quiet=True,
                     **kw)


FTRL = ["privacy.mechanism=dp_ftrl", "privacy.min_separation=3", "privacy.max_participations=3",
        "privacy.honaker=true"]
BANDED = ["privacy.mechanism=banded_mf", "privacy.min_separation=3", "privacy.bands=2"]


@pytest.mark.parametrize("mechanism", [FTRL, BANDED], ids=["dp_ftrl", "banded_mf"])
def test_a_run_keeps_the_bound_reports_epsilon_and_resumes_to_the_same_bytes(ray_local, tiny,
                                                                             tmp_path, mechanism):
    """In process straight through; paused and resumed (DP-FTRL on Ray): the same bytes."""
    common = ["rounds=10", "checkpoint.every=1", *mechanism]
    full = _run(tiny, *common)
    rows = _audit(full.run_dir, 3, 3 if mechanism is FTRL else None, 10)
    cfg = config_mod.load(TINY, common)
    acc = privacy.accountant(cfg)
    eps = full.metrics.column("dp_epsilon").to_pylist()
    assert eps == [acc.epsilon(t) for t in range(1, 11)] and full.summary["epsilon"] == eps[-1]
    assert [r["epsilon"] for r in rows] == acc.individual(
        [np.array(r["rounds"]) - 1 for r in rows], 10).tolist()
    part = full.summary["participation"]
    assert part["epsilon_individual_max"] <= eps[-1]
    assert part["clients"] == len(rows) and part["min_separation"] == 3
    # always online: eligible are those not in the last 2 rounds and below k, from the record
    k = 3 if mechanism is FTRL else 10
    eligible = [sum(all(not t - 3 < s < t for s in r["rounds"]) and
                    sum(s < t for s in r["rounds"]) < k for r in rows) + 20 - len(rows)
                for t in range(1, 11)]  # rounds from 1, as in the files
    assert [m["eligible"] for m in full.metrics.to_pylist()] == eligible
    paused = _run(tiny, *common, ray=mechanism is FTRL, run_dir=str(tmp_path / "paused"),
                  max_rounds=4)  # DP-FTRL on Ray actors, its server an actor
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == full.summary["model_sha256"]
    for name in ("participation.parquet",):
        assert pq.read_table(os.path.join(resumed.run_dir, name)).equals(
            pq.read_table(os.path.join(full.run_dir, name)))
    assert resumed.metrics.column("dp_epsilon").to_pylist() == eps


@pytest.mark.parametrize("mechanism", [FTRL, BANDED], ids=["dp_ftrl", "banded_mf"])
def test_a_fork_continues_the_noise_and_the_record(tiny, tmp_path, mechanism):
    common = ["rounds=9", "checkpoint.keep=[4]", "name=src", *mechanism]
    src = _run(tiny, *common)
    same = fork(src.run_dir, 4, run_dir=str(tmp_path / "same"), quiet=True)
    assert same.summary["model_sha256"] == src.summary["model_sha256"]
    assert pq.read_table(os.path.join(same.run_dir, "participation.parquet")).equals(
        pq.read_table(os.path.join(src.run_dir, "participation.parquet")))
    other = fork(src.run_dir, 4, ["local.lr=0.05", "rounds=12"], run_dir=str(tmp_path / "lr"),
                 quiet=True)
    assert other.summary["model_sha256"] != src.summary["model_sha256"]
    rows = _audit(other.run_dir, 3, 3 if mechanism is FTRL else None, 12)
    src_rows = pq.read_table(os.path.join(src.run_dir, "participation.parquet")).to_pylist()
    before = sorted((r["client"], t) for r in src_rows for t in r["rounds"] if t <= 4)
    assert sorted((r["client"], t) for r in rows for t in r["rounds"] if t <= 4) == before
    if mechanism is BANDED:  # the bands optimised for the source's 9 rounds go on, not 12's
        (state,) = checkpoint.load(other.run_dir)["state"].fields["transforms"]  # its slot
        assert np.array_equal(state["coefficients"],
                              banded.coefficients(2, "optimized", 9))
        assert not np.allclose(banded.coefficients(2, "optimized", 9),
                               banded.coefficients(2, "optimized", 12))


def test_with_no_noise_dp_ftrl_and_banded_mf_give_dp_fedavgs_bytes(tiny):
    """No separation to enforce: the same clients, clipped and summed, and nothing added."""
    plain = _run(tiny, "privacy.noise_multiplier=0", "rounds=5")
    for mechanism in (["privacy.mechanism=dp_ftrl", "privacy.restart=2",
                       "privacy.honaker=true"],
                      ["privacy.mechanism=banded_mf", "privacy.bands=1"]):
        run = _run(tiny, "privacy.noise_multiplier=0", "rounds=5", *mechanism)
        assert run.summary["model_sha256"] == plain.summary["model_sha256"]
        assert all(math.isinf(e) for e in run.metrics.column("dp_epsilon").to_pylist())
    noisy = _run(tiny, "privacy.noise_multiplier=0.5", "rounds=5", "privacy.mechanism=dp_ftrl")
    assert noisy.summary["model_sha256"] != plain.summary["model_sha256"]


def _trace(tmp_path) -> str:
    """20 clients online in turns of 100 virtual seconds, a quarter at a time."""
    path = tmp_path / "trace.csv"
    path.write_text("client_id,online_start,online_end\n" + "".join(
        f"{c},{(c % 4) * 100},{(c % 4) * 100 + 100}\n" for c in range(20)))
    return str(path)


@pytest.mark.parametrize("availability", [
    ["availability.model=diurnal", "availability.zones=2", "availability.interval_s=3600"],
    ["availability.model=bernoulli", "availability.overcommit=1.4", "availability.dropout=0.1"],
    ["availability.model=trace", "availability.interval_s=50"]],
    ids=["diurnal", "bernoulli", "trace"])
@pytest.mark.parametrize("mechanism", [FTRL, BANDED], ids=["dp_ftrl", "banded_mf"])
def test_realistic_availability_runs_under_the_bound(tiny, tmp_path, availability, mechanism):
    if "availability.model=trace" in availability:
        availability = availability + [f"availability.trace_path={_trace(tmp_path)}"]
    run = _run(tiny, "rounds=12", "data.num_clients=20", *mechanism, *availability)
    rows = _audit(run.run_dir, 3, 3 if mechanism is FTRL else None, 12)
    metrics = run.metrics.to_pylist()
    assert any(m["eligible"] < m["online"] for m in metrics)
    assert any(m["completed"] < 5 for m in metrics)  # realistic: some rounds come up short
    assert rows and run.summary["epsilon"] == privacy.accountant(
        config_mod.load(run.run_dir + "/config.yaml")).epsilon(12)


class Fastest(Selector):
    """The online clients whose round takes the least virtual time (ties: lower id): it reads
    no client report, so the participation bound is all its privacy needs."""

    def select(self, t, rng, online, m, losses):
        return online[np.lexsort((online, self.ctx.duration(online)))[:m]]


def test_a_selector_that_reads_no_client_report_runs_under_the_bound(tiny):
    """A user's selector picks among the clients the bound leaves eligible: rounds 1–3 take
    three disjoint cohorts; in round 4 round 1's (the fastest) are eligible again and chosen."""
    run = _run(tiny, "rounds=8", "data.num_clients=20", *FTRL,
               "selection.name=tests.test_privacy_mechanisms:Fastest")
    rows = _audit(run.run_dir, 3, 3, 8)
    cohort = [{r["client"] for r in rows if t in r["rounds"]} for t in range(1, 9)]
    assert all(len(c) == config_mod.load(TINY).clients_per_round for c in cohort)
    assert not (cohort[0] & cohort[1]) and not ((cohort[0] | cohort[1]) & cohort[2])
    assert cohort[3] == cohort[0]


def test_target_epsilon_stops_dp_ftrl(tiny):
    cfg = config_mod.load(TINY, ["rounds=12", *FTRL])
    target = privacy.accountant(cfg).epsilon(6) * (1 + 1e-9)
    run = _run(tiny, "rounds=12", *FTRL, f"privacy.target_epsilon={target}")
    assert run.metrics.num_rows == privacy.accountant(cfg).rounds_within(target, 12) >= 6
    assert run.summary["stopped_at_target_epsilon"]


def test_dp_fedavg_stays_refused_where_its_sampling_assumption_fails():
    with pytest.raises(config_mod.ConfigError) as e:
        config_mod.load(TINY, ["privacy.noise_multiplier=1", "availability.model=diurnal"])
    assert e.value.key == "availability.model" and "uniform client sampling" in str(e.value)


# ----- misuse of the keys: one line, exit 2, nothing created ---------------------------------


MISUSE = [
    (["privacy.min_separation=3"], "privacy.min_separation"),
    (["privacy.max_participations=2"], "privacy.max_participations"),
    (["privacy.bands=2"], "privacy.bands"),
    (["privacy.band_coefficients=sqrt"], "privacy.band_coefficients"),
    (["privacy.restart=2"], "privacy.restart"),
    (["privacy.honaker=true"], "privacy.honaker"),
    (["privacy.mechanism=dp_ftrl", "privacy.bands=2"], "privacy.bands"),
    (["privacy.mechanism=dp_ftrl", "privacy.band_coefficients=optimized"],
     "privacy.band_coefficients"),
    (["privacy.mechanism=banded_mf", "privacy.bands=2", "privacy.restart=2"], "privacy.restart"),
    (["privacy.mechanism=banded_mf", "privacy.bands=2", "privacy.honaker=true"],
     "privacy.honaker"),
    (["privacy.mechanism=banded_mf"], "privacy.bands"),
    (["privacy.mechanism=banded_mf", "privacy.bands=3", "privacy.min_separation=2"],
     "privacy.bands"),
    (["privacy.mechanism=banded_mf", "privacy.bands=5"], "privacy.bands"),  # > rounds
    (["privacy.mechanism=dp_ftrl", "privacy.restart=5"], "privacy.restart"),  # > rounds
    (["privacy.mechanism=dp_ftrl", "privacy.sampling=poisson"], "privacy.sampling"),
    (["privacy.mechanism=dp_ftrl", "privacy.adaptive_clip.target_quantile=0.5"],
     "privacy.adaptive_clip"),
    (["privacy.mechanism=banded_mf", "privacy.bands=1", "selection.name=oort"],
     "selection.name"),
    (["privacy.mechanism=dp_ftrl", "selection.name=power_of_choice"], "selection.name"),
    (["privacy.mechanism=dp_ftrl", "availability.model=diurnal", "availability.correlate=label"],
     "availability.correlate"),
    (["privacy.mechanism=dp_ftrl", "aggregation.mode=fedbuff"], "aggregation.mode"),
    (["privacy.mechanism=banded_mf", "privacy.bands=1", "aggregation.mode=fedasync"],
     "aggregation.mode"),
    (["privacy.mechanism=dp_ftrl", "algorithm.name=scaffold"], "algorithm.name"),
    (["privacy.mechanism=dp_ftrl", "aggregation.weighting=samples"], "aggregation.weighting"),
    (["privacy.mechanism=dp_ftrl", "privacy.target_epsilon=0.01"], "privacy.target_epsilon"),
    (["privacy.mechanism=dp_sgd"], "privacy.mechanism"),
    (["privacy.mechanism=dp_ftrl", "privacy.min_separation=0"], "privacy.min_separation"),
]


@pytest.mark.parametrize("overrides, key", MISUSE, ids=[" ".join(o)[:70] for o, _ in MISUSE])
def test_misused_privacy_keys_are_refused_with_their_reason(overrides, key, tmp_path, capsys,
                                                            cache, no_ray):  # noqa: F811
    line = _refused(["run", TINY, *overrides], key, tmp_path, capsys, cache)
    assert "expected" in line
