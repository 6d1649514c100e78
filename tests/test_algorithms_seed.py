"""Seed algorithms on quadratic clients, in-process, float64: fedmim, fedmsi and IMA.

Each test checks one independent fact against a reference written out by hand here: FedCM's
own update, FedAvg, hand-computed similarity graphs, a hand-rolled IMA loop, the spec's lr table.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rayfl import schema
from rayfl.algorithms import registry
from rayfl.algorithms.base import ClientTask
from rayfl.algorithms.server_opt import sgd
from rayfl.layers import Facts, Stack
from rayfl.algorithms.fedavg import FedAvg
from rayfl.algorithms.fedmim import FedMIM, FedMIMParams
from rayfl.algorithms.fedmsi import FedMSI, FedMSIParams, csr_to_dense, dense_graph, orient
from rayfl.algorithms.fedopt import FedAdam
from rayfl.algorithms.ima import IMA, IMAParams, start_round
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from rayfl.schema import ConfigError
from tests.core_helpers import FixedTraining, init

D = 6
K = 4
DT = torch.float64


def make_clients(n_clients=5, seed=0, sizes=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_clients):
        a = 0.5 + 2.0 * torch.rand(D, generator=g, dtype=DT)
        b = 3.0 * torch.randn(D, generator=g, dtype=DT)
        out.append(quadratic_client(a, b, n=(sizes[i] if sizes else 10 + 7 * i)))
    return out


def x0():
    return torch.linspace(-1.0, 1.0, D, dtype=DT)


def partial(n_clients, m, seed=1):
    def sample(t):
        return np.random.default_rng([seed, t]).choice(n_clients, size=m, replace=False).tolist()
    return sample


SPEC = LocalSpec(steps=K)


# ----- FedMIM ----------------------------------------------------------------------------------
def mim(alpha, beta, history="broadcast", weighting="uniform", n=5):
    return FedMIM(FedMIMParams(alpha=alpha, beta=beta, history=history), weighting=weighting,
                  num_clients=n)


def test_fedmim_registered():
    assert registry.get("fedmim") is FedMIM and registry.get("fedmsi") is FedMSI


def test_fedmim_zero_weights_is_fedavg_bitwise():
    clients = make_clients()
    spec = LocalSpec(steps=K, weight_decay=1e-2)
    kw = dict(rounds=6, lr0=0.05, lr_decay=0.95, sample=partial(5, 3))
    s_avg, _, _ = simulate(FedAvg(weighting="samples"), x0(), clients, spec, **kw)
    s_mim, _, _ = simulate(mim([0.0, 0.0], [0.0, 0.0], weighting="samples"), x0(), clients, spec,
                           **kw)
    assert torch.equal(s_avg.x, s_mim.x)


def test_fedmim_j1_beta0_is_fedcm():
    """FedCM (Xu et al. 2021): v = α g + (1−α) Δ_t; y ← y − η_l v; Δ_{t+1} = (x_t − x̄)/(η_l K)."""
    alpha_cm, lr, rounds = 0.1, 0.05, 6
    clients = make_clients()
    state, _, _ = simulate(mim([1 - alpha_cm], [0.0]), x0(), clients, SPEC, rounds=rounds,
                           lr0=lr)
    x, big_delta = x0(), torch.zeros(D, dtype=DT)
    for _ in range(rounds):
        ys = []
        for c in clients:
            y = x.clone()
            for _ in range(K):
                _, g = c.grad_fn(y, None)
                y = y - lr * (alpha_cm * g + (1 - alpha_cm) * big_delta)
            ys.append(y)
        x_new = torch.stack(ys).mean(0)  # η_g = 1, uniform
        big_delta = (x - x_new) / (lr * K)
        x = x_new
    assert torch.allclose(state.x, x, rtol=1e-12, atol=1e-12)


def test_fedmim_one_step_matches_algorithm1():
    """After one round δ_1 = (x_0 − x_1)/K; a local step is y − m_α − (1−Σα) η g(y − m_β)."""
    alpha, beta, lr = [0.6, 0.3], [0.9, 0.1], 0.05
    algo = mim(alpha, beta)
    clients = make_clients()
    # rebuild the increments by hand from three recorded global models
    xs = [x0()]
    st = None
    for t in range(2):
        st, _, _ = simulate(algo, x0(), clients, SPEC, rounds=1, lr0=lr, state=st, start_round=t)
        xs.append(st.x.clone())
    d1, d2 = (xs[1] - xs[2]) / K, (xs[0] - xs[1]) / K  # newest first
    m_a, m_b = alpha[0] * d1 + alpha[1] * d2, beta[0] * d1 + beta[1] * d2
    bc = algo.broadcast(st.x, st.algorithm, 2)
    ctx = FixedTraining(bc["x"], bc["x"], K, lr)
    algo.client_train(ClientTask(0, 2, lr, 1.0, bc, None), ctx)
    rule = ctx.rule
    y = torch.arange(D, dtype=DT)
    _, g = clients[0].grad_fn(rule.grad_point(y), None)
    step = y - lr * rule.direction(g, y, lr)
    _, g_ref = clients[0].grad_fn(y - m_b, None)
    expected = y - m_a - (1 - sum(alpha)) * lr * g_ref
    assert torch.allclose(step, expected, rtol=1e-12, atol=1e-12)


def test_fedmim_inertia_is_sum_alpha_times_last_move_with_unequal_steps():
    """Clients of 2..40 samples (K_i = n_i), sample weighting: with zero gradients the next round
    moves Σα = 0.9 times the last global move — not more, which would diverge."""
    sizes = [2, 5, 9, 40]
    algo = mim([0.9], [0.0], weighting="samples", n=len(sizes))
    spec = LocalSpec(epochs=1, batch_size=1)
    kw = dict(rounds=1, lr0=0.01)
    st, _, _ = simulate(algo, x0(), make_clients(4, sizes=sizes), spec, **kw)
    flat = [quadratic_client(torch.zeros(D, dtype=DT), torch.zeros(D, dtype=DT), n=n)
            for n in sizes]  # f_i = 0
    st2, _, _ = simulate(algo, x0(), flat, spec, state=st, start_round=1, **kw)
    last_move = x0() - st.x
    assert last_move.norm() > 0.1
    assert torch.allclose(st.x - st2.x, 0.9 * last_move, rtol=1e-12, atol=1e-14)


def test_fedmim_participation_equals_broadcast_under_full_participation():
    clients = make_clients()
    kw = dict(rounds=6, lr0=0.05, lr_decay=0.98)
    s_b, _, _ = simulate(mim([0.6, 0.3], [0.9, 0.1]), x0(), clients, SPEC, **kw)
    s_p, _, cs = simulate(mim([0.6, 0.3], [0.9, 0.1], "participation"), x0(), clients, SPEC,
                          **kw)
    assert torch.equal(s_b.x, s_p.x)
    assert set(cs[0].algorithm) == {"mim_x", "mim_t", "mim_d1"}
    # partial participation: a client's history is its own, so the two modes part ways
    kw["sample"] = partial(5, 2)
    s_b, _, _ = simulate(mim([0.6, 0.3], [0.9, 0.1]), x0(), clients, SPEC, **kw)
    s_p, _, _ = simulate(mim([0.6, 0.3], [0.9, 0.1], "participation"), x0(), clients, SPEC, **kw)
    assert not torch.allclose(s_b.x, s_p.x)


@pytest.mark.parametrize("raw, key", [
    ({"alpha": [0.6, 0.5]}, "algorithm.alpha"),
    ({"alpha": [1.0], "beta": [0.0]}, "algorithm.alpha"),
    ({"alpha": [0.6, 0.3], "beta": [0.9]}, "algorithm.beta"),
    ({"beta": [0.9, -0.1]}, "algorithm.beta[1]"),
    ({"history": "sometimes"}, "algorithm.history"),
])
def test_fedmim_params_rejected(raw, key):
    with pytest.raises(ConfigError) as e:
        schema.build(FedMIMParams, raw, "algorithm")
    assert e.value.key == key


# ----- fedmsi ----------------------------------------------------------------------------------
def msi(n, weighting="samples", **params):
    return FedMSI(FedMSIParams(**params), weighting=weighting, num_clients=n)


def setup_msi(algo, raw_inputs, x_init):
    summaries = torch.stack([torch.as_tensor(algo.client_setup(x, None)) for x in raw_inputs])
    state = init(algo, x_init)
    own = algo.server_setup(state.algorithm, np.arange(len(raw_inputs)), summaries)
    return dataclasses.replace(state, algorithm=own)


def random_inputs(n, seed=0, dim=D):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(int(rng.integers(3, 12)), dim)).astype(np.uint8)
            for _ in range(n)]


HAND_INPUTS = [
    np.array([[2, 0, 0], [0, 1, 0], [2, 0, 0], [0, 0, 1]], float),  # n > D: m = e1
    np.array([[0, 3, 0], [0, 1, 0]], float),  # m = e2
    np.array([[1, 1, 0], [2, 2, 0]], float),  # m = (e1 + e2)/√2
    np.array([[0, 0, 5]], float),  # m = e3
]


def test_fedmsi_graph_and_degree_weights_by_hand():
    algo = msi(4, weighting="degree")
    state = setup_msi(algo, HAND_INPUTS, torch.zeros(3, dtype=DT))
    ln2 = math.log(2.0)
    c = -math.log(0.5 * (1 - 1 / math.sqrt(2)))  # m_iᵀm_j = 1/√2
    expected = torch.tensor([[0, ln2, c, ln2],
                             [ln2, 0, c, ln2],
                             [c, c, 0, ln2],
                             [ln2, ln2, ln2, 0]], dtype=DT)
    assert torch.allclose(state.algorithm.A, expected, atol=1e-12)
    deg = [2 * ln2 + c, 2 * ln2 + c, 2 * c + ln2, 3 * ln2]
    w = algo.aggregation_weights(state.algorithm, [0, 1, 2, 3], [4, 2, 2, 1])
    assert np.allclose(np.array(w) / sum(w), np.array(deg) / sum(deg), atol=1e-12)
    assert np.allclose(algo.aggregation_weights(state.algorithm, [3, 1], [1, 2]),
                       [deg[3], deg[1]])


def test_fedmsi_sign_fix_and_identical_clients():
    """Flipped messages give the same graph; identical clients hit the 1e-12 clamp."""
    algo = msi(4)
    m = torch.stack([torch.as_tensor(algo.client_setup(x, None)) for x in HAND_INPUTS])
    assert (m.sum(1) > 0).all()
    flipped = m * torch.tensor([-1.0, 1.0, -1.0, 1.0], dtype=DT)[:, None]
    s1 = algo.server_setup(algo.server_init(torch.zeros(3)), np.arange(4), m)
    s2 = algo.server_setup(algo.server_init(torch.zeros(3)), np.arange(4), flipped)
    assert torch.equal(s1.A, s2.A)
    twins = msi(2)
    st = setup_msi(twins, [HAND_INPUTS[1], 2 * HAND_INPUTS[1]], torch.zeros(3))
    assert st.algorithm.A[0, 1] == pytest.approx(-math.log(1e-12))


def test_fedmsi_knn_graph_equals_dense_when_k_is_n_minus_1():
    n = 7
    inputs = random_inputs(n)
    dense = setup_msi(msi(n), inputs, torch.zeros(D)).algorithm
    sparse = setup_msi(msi(n, dense_max_clients=0, knn=n - 1), inputs, torch.zeros(D)).algorithm
    assert sparse.A is None
    a = csr_to_dense(sparse.crow, sparse.col, sparse.val)
    assert torch.allclose(a, dense.A, rtol=1e-12, atol=1e-12)
    assert torch.allclose(sparse.deg, dense.deg, rtol=1e-12)


def test_fedmsi_knn_graph_is_union_of_k_nearest():
    n, k = 9, 2
    inputs = random_inputs(n, seed=3)
    full = setup_msi(msi(n), inputs, torch.zeros(D)).algorithm.A.numpy()
    sparse = setup_msi(msi(n, dense_max_clients=0, knn=k), inputs, torch.zeros(D)).algorithm
    a = csr_to_dense(sparse.crow, sparse.col, sparse.val).numpy()
    keep = np.zeros((n, n), bool)
    for i in range(n):
        row = full[i].copy()
        row[i] = -np.inf
        keep[i, np.argsort(-row)[:k]] = True
    keep |= keep.T
    assert np.allclose(a, np.where(keep, full, 0.0), rtol=1e-12, atol=1e-12)


def test_fedmsi_beta_one_is_fedavg_bitwise():
    n = 5
    clients = make_clients(n)
    algo = msi(n, beta=1.0)
    state = setup_msi(algo, random_inputs(n), x0())
    kw = dict(rounds=5, lr0=0.05, sample=partial(n, 3))
    s_msi, _, _ = simulate(algo, x0(), clients, SPEC, state=state, **kw)
    s_avg, _, _ = simulate(FedAvg(), x0(), clients, SPEC, **kw)
    assert torch.equal(s_msi.x, s_avg.x)


def test_fedmsi_local_step_and_anchor_rule():
    """Round 0: gradient at β y + (1−β) x_0. Round 1: u_i = Σ_{j∈S_0} A_ij y_j / Σ A_ij."""
    n, beta, lr = 4, 0.7, 0.05
    clients = make_clients(n)
    algo = msi(n, beta=beta)
    state = setup_msi(algo, HAND_INPUTS, x0())
    a = state.algorithm.A
    s0 = [0, 2, 3]
    state, _, _ = simulate(algo, x0(), clients, SPEC, rounds=1, lr0=lr, state=state,
                           sample=lambda t: s0)
    ys = {}
    for j in s0:  # the paper's perturbed local step, written out
        y = x0()
        for _ in range(K):
            _, g = clients[j].grad_fn(beta * y + (1 - beta) * x0(), None)
            y = y - lr * g
        ys[j] = y
    assert torch.allclose(state.x, sum(clients[j].n * ys[j] for j in s0)
                          / sum(clients[j].n for j in s0), rtol=1e-12)
    bc = algo.broadcast(state.x, state.algorithm, 1)
    for i in range(n):
        w = {j: float(a[i, j]) for j in s0 if j != i}
        u = sum(w[j] * ys[j] for j in w) / sum(w.values())
        assert torch.allclose(algo.anchor(bc, i), u, rtol=1e-12, atol=1e-12)
    # S_0 = {1}: client 1 has no neighbour among last round's participants → fallback anchor
    x_other = x0() + 1.0
    own = algo.anchors(setup_msi(algo, HAND_INPUTS, x0()).algorithm, [1],
                       torch.stack([x_other]))
    x_t = x0() * 3
    bc = algo.broadcast(x_t, own, 1)
    assert torch.equal(algo.anchor(bc, 1), x_t)  # default: the round's x_t
    assert torch.allclose(algo.anchor(bc, 0), x_other)
    initial = msi(n, beta=beta, anchor_fallback="x0")
    assert torch.equal(initial.anchor(initial.broadcast(x_t, own, 1), 1), x0())


def test_orient_handles_zero_sum_rows():
    m = torch.tensor([[1.0, -1.0, 0.0], [0.0, -2.0, 0.0]], dtype=DT)
    out = orient(m)
    assert torch.allclose(out.norm(dim=1), torch.ones(2, dtype=DT))
    assert out[1, 1] > 0 and out[0, 0] > 0
    assert torch.allclose(dense_graph(out), dense_graph(-out))


# ----- IMA -------------------------------------------------------------------------------------
def ima(rounds=1, adaptive=False, **params):
    """IMA with these keys (``start`` ≥ 1: the round index t_s) in a run of ``rounds``."""
    return IMA(IMAParams(**params), Facts(rounds=rounds, adaptive_server_opt=adaptive))


def ima_lr(t, lr0, decay, t_s, after):
    return lr0 * decay**t if t < t_s else lr0 * decay**t_s * after ** (t - t_s)


def test_ima_sends_mean_of_last_window_inner_models():
    n, rounds, t_s, P, lr0, decay, after = 5, 9, 4, 3, 0.05, 0.99, 0.9
    clients = make_clients(n)
    sample = partial(n, 2, seed=7)
    # by hand: FedAvg one round at a time; from t_s the clients start from the window mean
    sent_ref, outs, x = [], [], x0()
    for t in range(rounds):
        sent_ref.append(x)
        st, _, _ = simulate(FedAvg(), x, clients, SPEC, rounds=1, lr0=ima_lr(t, lr0, decay, t_s,
                                                                             after),
                            sample=sample, start_round=t)
        outs.append(st.x)
        x = torch.stack(outs[-P:]).mean(0) if t >= t_s else st.x
    wrapper = ima(window=P, start=t_s, decay_after=after)
    stack = Stack(FedAvg(), sgd(1.0), [wrapper])
    state, sent = stack.init(x0()), []
    for t in range(rounds):
        sent.append(stack.start(state, t).clone())
        state, _, _ = simulate(FedAvg(), x0(), clients, SPEC, rounds=1, lr0=lr0, lr_decay=decay,
                               state=state, sample=sample, start_round=t, wrappers=[wrapper])
    for t in range(t_s + 1):  # before IMA's first mean: the inner's own model
        assert torch.equal(sent[t], sent_ref[t])
    for t in range(t_s + 1, rounds):
        assert torch.allclose(sent[t], sent_ref[t], rtol=1e-13, atol=1e-13)
    assert torch.allclose(stack.deployed(state), x, rtol=1e-13, atol=1e-13)
    assert torch.allclose(stack.extra_models(state)["ima_inner"], outs[-1])
    assert state.wrappers[0].buf.shape == (P, D)


@pytest.mark.parametrize("rounds, t_s, at_ts, last_ima, last_plain", [
    (300, 225, 1.042e-3, 1.094e-4, 4.954e-4),
    (400, 300, 4.904e-4, 2.404e-5, 1.813e-4),
    (200, 150, 2.215e-3, 4.978e-4, 1.353e-3),
])
def test_ima_lr_schedule_matches_spec_table(rounds, t_s, at_ts, last_ima, last_plain):
    wrapper = ima(rounds, start=0.75, decay_after=0.97)
    assert wrapper.t_s == t_s
    with_ima, plain = Stack(FedAvg(), sgd(1.0), [wrapper]), Stack(FedAvg(), sgd(1.0))
    state, bare = with_ima.init(x0()), plain.init(x0())
    assert with_ima.client_lr(state, t_s, 0.01, 0.99) == pytest.approx(at_ts, rel=5e-4)
    assert with_ima.client_lr(state, rounds - 1, 0.01, 0.99) == pytest.approx(last_ima, rel=5e-4)
    assert plain.client_lr(bare, rounds - 1, 0.01, 0.99) == pytest.approx(last_plain, rel=5e-4)
    assert with_ima.client_lr(state, t_s - 1, 0.01, 0.99) == \
        plain.client_lr(bare, t_s - 1, 0.01, 0.99)


def test_ima_start_round():
    assert start_round(0.75, 400) == 300 and start_round(150.0, 400) == 150
    assert start_round(0.7, 100) == 70 and start_round(0.0, 10) == 0


def recorder(resets: list):
    """SGD at η_g = 1 that counts as adaptive and counts its restarts."""
    def reset(x):
        resets.append(True)
        return {}

    return dataclasses.replace(sgd(1.0), adaptive=True, reset=reset)


def _run(inner, wrapper, rounds=7, n=5, opt=None):
    opt = opt or inner.default_server_opt()
    stack = Stack(inner, opt, [wrapper])
    state, sent = stack.init(x0()), []
    for t in range(rounds):
        sent.append(stack.start(state, t).clone())
        state, _, _ = simulate(inner, x0(), make_clients(n), SPEC, rounds=1, lr0=0.05,
                               state=state, sample=partial(n, 2, seed=3), start_round=t,
                               wrappers=[wrapper], server_opt=opt)
    return state, sent


def test_ima_resets_inner_moments_once_at_start_and_only_when_asked():
    resets = []
    _run(FedAvg(), ima(adaptive=True, window=2, start=3), opt=recorder(resets))
    assert len(resets) == 1
    resets = []
    _run(FedAvg(), ima(adaptive=True, window=2, start=3, reset_server_moments=False),
         opt=recorder(resets))
    assert resets == []


def test_ima_target_mode_equals_output_mode_for_unit_server_step():
    """Averaging the pseudo-targets then stepping with η_g = 1 lands on the same mean."""
    _, sent_out = _run(FedAvg(), ima(window=3, start=2))
    target = ima(adaptive=True, window=3, start=2)
    assert target.average == "target"
    _, sent_tgt = _run(FedAvg(), target, opt=recorder([]))
    for a, b in zip(sent_out, sent_tgt):
        assert torch.allclose(a, b, rtol=1e-13, atol=1e-13)


def test_ima_fedadam_moments_restart_on_mean_target():
    """At t_s the moments restart from zero and Adam is fed u = mean(targets) − x_t."""
    t_s = 3
    adam = FedAdam()
    state, sent = _run(adam, ima(adaptive=True, window=2, start=t_s), rounds=t_s + 1)
    u = state.wrappers[0].buf.mean(0) - sent[t_s]  # −Δ̄' with Δ̄' = x_t − mean(targets)
    assert torch.allclose(state.server_opt["m"], (1 - adam.p.beta1) * u, rtol=1e-12,
                          atol=1e-15)
    state2, _ = _run(FedAdam(), ima(adaptive=True, window=2, start=t_s,
                                    reset_server_moments=False), rounds=t_s + 1)
    assert not torch.allclose(state2.server_opt["m"], (1 - adam.p.beta1) * u)


def test_ima_owns_its_slot_and_the_inner_keeps_its_own():
    algo, wrapper = msi(4), ima(window=2, start=1)
    stack = Stack(algo, algo.default_server_opt(), [wrapper])
    state = stack.init(torch.zeros(3, dtype=DT))
    summaries = torch.stack([torch.as_tensor(algo.client_setup(x, None)) for x in HAND_INPUTS])
    own = algo.server_setup(state.algorithm, np.arange(4), summaries)
    assert own.A is not None and state.wrappers[0].buf.shape == (0, 3)
    assert algo.traits.has("setup") and not FedAvg.traits.has("setup")
