"""Classic and seed algorithms on problems whose answers are known independently of the code.

Quadratic clients f_i(x) = ½ xᵀ diag(a_i) x − b_iᵀ x, full-batch gradient descent locally, float64.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rayfl import schema
from rayfl.algorithms import registry
from rayfl.algorithms.base import Aggregate, ClientTask, ServerParams
from tests.core_helpers import FixedTraining, init, update, with_state
from rayfl.runtime.context import ClientData, LocalContext
from rayfl.rng import client_stream
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.training import run_client
from rayfl.runtime.local import LocalSpec
from rayfl.contract import ComponentError
from rayfl.schema import ConfigError

F64 = torch.float64
N, D = 4, 5
ETA, K = 0.1, 10  # local lr, local GD steps


def problem(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    a = 0.2 + 2.8 * torch.rand(N, D, generator=g, dtype=F64)
    b = 2 * torch.randn(N, D, generator=g, dtype=F64)
    return a, b


A, B = problem()
X_STAR = B.sum(0) / A.sum(0)  # argmin Σ f_i
X0 = torch.zeros(D, dtype=F64)
CLIENTS = [quadratic_client(A[i], B[i]) for i in range(N)]
SPEC = LocalSpec(steps=K, batch_size=1)


def make(name: str, weighting: str = "uniform", num_clients: int = N, local_momentum=0.0,
         **params):
    cls = registry.get(name)
    return cls(cls.Params(**params), weighting=weighting, num_clients=num_clients,
               local_momentum=local_momentum)


def run(name: str, rounds: int, clients=CLIENTS, spec=SPEC, weighting="uniform", **params):
    algo = make(name, weighting, len(clients), spec.momentum, **params)
    state, hist, cstates = simulate(algo, X0, clients, spec, rounds, ETA)
    return algo, state, hist, cstates


def agg_of(deltas, weights, num_clients=10, extras=None) -> Aggregate:
    """The Aggregate the runtime would build from explicit client updates Δ_k."""
    w = torch.tensor(weights, dtype=F64)
    dk = torch.stack(deltas)
    return Aggregate(count=len(deltas), num_sampled=len(deltas), num_clients=num_clients,
                     weight_sum=float(w.sum()), delta_mean=(w[:, None] * dk).sum(0) / w.sum(),
                     delta_sum=dk.sum(0), delta_sq_sum=float((dk * dk).sum()),
                     extras=extras or {})


def fedavg_fixed_point(eta=ETA, k=K):
    """x = mean_i [M_i x + (I − M_i) A_i⁻¹ b_i], M_i = (I − ηA_i)^K, solved elementwise."""
    m = (1 - eta * A) ** k
    return ((1 - m) * B / A).sum(0) / (1 - m).sum(0)


# ----- exact vs biased fixed points ------------------------------------------------------------

def test_fedavg_converges_to_its_biased_fixed_point():
    _, state, _, _ = run("fedavg", 300)
    x_fp = fedavg_fixed_point()
    assert torch.allclose(state.x, x_fp, atol=1e-10, rtol=0)
    assert (x_fp - X_STAR).norm() > 0.1  # client drift: measurably not the optimum


def test_scaffold_converges_to_optimum():
    _, state, hist, _ = run("scaffold", 300)
    assert (state.x - X_STAR).norm() < 1e-10
    assert "c_norm" in hist[-1]


def test_feddyn_converges_to_optimum():
    _, state, hist, _ = run("feddyn", 300, alpha=1.0)
    assert (state.x - X_STAR).norm() < 1e-10
    assert hist[-1]["h_norm"] < 1e-8  # server h → (1/N) Σ ∇f_i(x*) = 0


def test_feddyn_h_is_mean_of_all_client_states():
    """h^t = (1/N) Σ_i ĝ_i over all N clients, absent ones included (FedDyn's invariant)."""
    g = torch.Generator().manual_seed(5)
    picks = [sorted(torch.randperm(N, generator=g)[:3].tolist()) for _ in range(10)]
    algo = make("feddyn", weighting="samples", alpha=0.3)
    state, _, cstates = simulate(algo, X0, CLIENTS, SPEC, 10, ETA, sample=lambda t: picks[t])
    g_all = sum(cstates[i].algorithm["g_hat"] if i in cstates else torch.zeros(D, dtype=F64)
                for i in range(N)) / N
    assert torch.allclose(state.algorithm.h, g_all, atol=1e-12)


def test_adabest_bias_small_and_proportional_to_one_minus_beta():
    mu = 0.1
    fedavg_bias = float((fedavg_fixed_point() - X_STAR).norm())
    bias = {}
    for beta in (0.9, 0.99):
        algo, state, hist, _ = run("adabest", 600, mu=mu, beta=beta)
        x = algo.deployed(state.x, state.algorithm)
        assert torch.equal(x, state.algorithm.x_bar)
        assert torch.allclose(algo.extra_models(state.x, state.algorithm)["next"], x,
                              atol=1e-10)  # converged: h → 0
        bias[beta] = float((x - X_STAR).norm())
        # the known fixed point: Σ_i ∇f_i(x∞) = μ N (1 − β)(x_0 − x∞)
        grad_sum = A.sum(0) * x - B.sum(0)
        assert torch.allclose(grad_sum, mu * N * (1 - beta) * (X0 - x), rtol=1e-6, atol=1e-9)
    assert bias[0.9] < 0.1 * fedavg_bias
    assert 8.0 < bias[0.9] / bias[0.99] < 12.0


# ----- AdaBest -----------------------------------------------------------------------------------

@pytest.mark.parametrize("beta", [0.5, 0.96])
def test_adabest_server_is_nesterov_sgd(beta):
    g = torch.Generator().manual_seed(7)
    algo = make("adabest", beta=beta)
    state = init(algo, X0)
    p = torch.nn.Parameter(X0.clone())
    opt = torch.optim.SGD([p], lr=1.0, momentum=beta, nesterov=True)
    for t in range(8):
        x_bar = torch.randn(D, generator=g, dtype=F64)  # mean of this round's client models
        assert torch.allclose(p.detach(), state.x, atol=1e-12)  # cloud model θ^{t-1}
        state, _ = update(algo, state, agg_of([state.x - x_bar], [1.0]), t)
        p.grad = p.detach() - x_bar  # pseudo-gradient ḡ^t = θ^{t-1} − θ̄^t
        opt.step()
        assert torch.allclose(p.detach(), state.x, atol=1e-12)
        assert torch.allclose(algo.deployed(state.x, state.algorithm), x_bar, atol=1e-14)


def test_adabest_client_estimate_decays_with_absence():
    algo = make("adabest", mu=0.5)
    x_t = torch.ones(D, dtype=F64)
    y = torch.full((D,), 0.25, dtype=F64)
    h_old = torch.arange(D, dtype=F64)
    cstate = {"h": h_old, "t_last": torch.tensor([2.0], dtype=F64)}
    ctx = FixedTraining(x_t, y, 3)
    res = algo.client_train(ClientTask(0, 5, 0.1, 1.0, {"x": x_t}, cstate), ctx)
    assert torch.allclose(res.state["h"], h_old / 3 + (x_t - y))  # last seen 3 rounds ago
    assert res.state["t_last"].item() == 5
    gvec = torch.ones(D, dtype=F64)
    assert torch.allclose(ctx.rule.direction(gvec, y, 0.1), gvec - 0.5 * h_old)
    first = algo.client_train(ClientTask(0, 0, 0.1, 1.0, {"x": x_t}, None),
                              FixedTraining(x_t, y, 3))
    assert torch.allclose(first.state["h"], x_t - y)


# ----- FedEve ------------------------------------------------------------------------------------

FEVE_DK = [torch.tensor(v, dtype=F64) for v in
           ([1.0, -2.0, 0.5, 0.0], [0.5, -1.0, 1.5, 2.0], [-1.0, 0.0, 0.5, 1.0])]
FEVE_W = [1.0, 2.0, 5.0]


def test_fedeve_round_matches_formulas():
    eta_g = 0.7
    algo = make("fedeve", server_lr=eta_g)
    x = torch.tensor([0.3, 0.1, -0.2, 1.0], dtype=F64)
    M = torch.tensor([0.2, -1.0, 0.4, 0.5], dtype=F64)
    s = 0.05
    state = with_state(init(algo, x), M=M, s=s)
    assert torch.allclose(algo.broadcast(state.x, state.algorithm, 0)["x"], x - eta_g * M)  # ŵ
    for t in range(2):
        new, metrics = update(algo, state, agg_of(FEVE_DK, FEVE_W), t)
        d = 4
        Dm = sum(w * dk for w, dk in zip(FEVE_W, FEVE_DK)) / sum(FEVE_W)
        q = float(((state.algorithm.M - Dm) ** 2).sum()) / (3 * d)
        r = sum(float(((dk - Dm) ** 2).sum()) for dk in FEVE_DK) / (3**2 * d)
        s_hat = state.algorithm.s + q
        gain = s_hat / (s_hat + r)
        M_new = (1 - gain) * state.algorithm.M + gain * Dm
        assert metrics["q"] == pytest.approx(q, rel=1e-12)
        assert metrics["r"] == pytest.approx(r, rel=1e-12)
        assert metrics["kalman_gain"] == pytest.approx(gain, rel=1e-12)
        assert torch.allclose(new.algorithm.M, M_new, atol=1e-14)
        assert torch.allclose(new.x, state.x - eta_g * M_new, atol=1e-14)
        assert new.algorithm.s == pytest.approx((1 - gain) * s_hat, rel=1e-12)
        state = new


def test_fedeve_gain_one_reduces_to_trusting_the_clients():
    algo = make("fedeve")
    x = torch.tensor([0.3, 0.1, -0.2, 1.0], dtype=F64)
    M = torch.tensor([0.2, -1.0, 0.4, 0.5], dtype=F64)
    Dk = torch.tensor([1.0, 2.0, -1.0, 0.0], dtype=F64)
    # r = 0: every client agrees, so K = 1, M ← D, s ← 0
    state = with_state(init(algo, x), M=M, s=0.3)
    new, m = update(algo, state, agg_of([Dk, Dk, Dk], [1.0, 2.0, 3.0]), 0)
    assert m["r"] == pytest.approx(0.0, abs=1e-14) and m["kalman_gain"] == pytest.approx(1.0)
    assert torch.allclose(new.algorithm.M, Dk) and torch.allclose(new.x, x - Dk)
    assert new.algorithm.s == pytest.approx(0.0, abs=1e-12)
    # s huge: the prior is worthless, K → 1
    state = with_state(init(algo, x), M=M, s=1e12)
    new, m = update(algo, state, agg_of(FEVE_DK, FEVE_W), 0)
    Dm = sum(w * dk for w, dk in zip(FEVE_W, FEVE_DK)) / sum(FEVE_W)
    assert m["kalman_gain"] == pytest.approx(1.0, abs=1e-10)
    assert torch.allclose(new.algorithm.M, Dm, atol=1e-9)


def test_fedeve_clients_train_from_the_prediction():
    algo, state, hist, _ = run("fedeve", 3)
    assert {"kalman_gain", "q", "r"} <= set(hist[0])
    assert 0.0 < hist[0]["kalman_gain"] <= 1.0
    # round 0: M = 0, s = 0, so ŵ = x_0 and K = q / (q + r)
    assert hist[0]["kalman_gain"] == pytest.approx(hist[0]["q"] / (hist[0]["q"] + hist[0]["r"]))


# ----- FedOpt ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,v_new", [
    ("fedadam", [0.4959, 0.0115]),   # 0.99 v + 0.01 u²
    ("fedyogi", [0.4991, 0.0116]),   # v − 0.01 u² sign(v − u²), sign = (+, −)
    ("fedadagrad", [0.59, 0.17]),    # v + u²
])
def test_fedopt_one_server_step(name, v_new):
    algo = make(name)  # η_g = 0.01, β1 = 0.9, β2 = 0.99, τ = 1e-3
    x = torch.tensor([1.0, -1.0], dtype=F64)
    state = dataclasses.replace(init(algo, x), server_opt={
        "m": torch.tensor([0.1, -0.2], dtype=F64), "v": torch.tensor([0.5, 0.01], dtype=F64)})
    delta = torch.tensor([0.3, -0.4], dtype=F64)  # u = −Δ̄ = (−0.3, 0.4), u² = (0.09, 0.16)
    new, _ = update(algo, state, agg_of([delta], [1.0]), 0)
    m_new = [0.06, -0.14]  # 0.9 m + 0.1 u
    x_new = [1.0 + 0.01 * m_new[0] / (math.sqrt(v_new[0]) + 1e-3),
             -1.0 + 0.01 * m_new[1] / (math.sqrt(v_new[1]) + 1e-3)]
    assert new.server_opt["m"].tolist() == pytest.approx(m_new, abs=1e-15)
    assert new.server_opt["v"].tolist() == pytest.approx(v_new, abs=1e-15)
    assert new.x.tolist() == pytest.approx(x_new, abs=1e-15)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_fedopt_defaults_and_reset(name):
    algo = make(name)
    assert (algo.server_lr, algo.p.beta1, algo.p.tau) == (0.01, 0.9, 1e-3)
    state = init(algo, X0)
    state, _ = update(algo, state, agg_of([torch.ones(D, dtype=F64)], [1.0]), 0)
    assert torch.allclose(init(algo, X0).server_opt["v"], torch.full((D,), 1e-6, dtype=F64))  # τ²
    reset = algo.default_server_opt().restart(state.x)  # the IMA authors' reset: m = v = 0
    assert torch.all(reset["m"] == 0) and torch.all(reset["v"] == 0)


# ----- FedAvgM / FedProx / FedNova ---------------------------------------------------------------

def test_fedavgm_without_momentum_is_fedavg():
    _, ref, _, _ = run("fedavg", 20)
    _, st, _, _ = run("fedavgm", 20, momentum=0.0)
    assert torch.allclose(st.x, ref.x, atol=1e-14)


@pytest.mark.parametrize("nesterov", [False, True])
def test_fedavgm_two_rounds(nesterov):
    beta, eta_g = 0.9, 0.5
    algo = make("fedavgm", momentum=beta, server_lr=eta_g, nesterov=nesterov)
    a = torch.tensor([1.0, -2.0], dtype=F64)
    b = torch.tensor([0.5, 3.0], dtype=F64)
    x0 = torch.tensor([0.1, 0.2], dtype=F64)
    st, _ = update(algo, init(algo, x0), agg_of([a], [1.0]), 0)
    st, m = update(algo, st, agg_of([b], [1.0]), 1)
    if nesterov:  # x ← x − η_g (Δ̄ + β m), m the updated buffer
        x1 = x0 - eta_g * (a + beta * a)
        expected = x1 - eta_g * (b + beta * (beta * a + b))
    else:
        expected = x0 - eta_g * a - eta_g * (beta * a + b)
    assert torch.allclose(st.x, expected)
    assert m["momentum_norm"] == pytest.approx(float((beta * a + b).norm()))


def test_fedprox_mu_zero_is_fedavg():
    _, ref, _, _ = run("fedavg", 20)
    _, st, _, _ = run("fedprox", 20, mu=0.0)
    assert torch.allclose(st.x, ref.x, atol=1e-14)


def test_fedprox_large_mu_stays_near_start():
    x_t = torch.ones(D, dtype=F64)
    spec = LocalSpec(steps=300, batch_size=1)
    moves = {}
    for mu in (0.0, 15.0):
        algo = make("fedprox", mu=mu)
        task = ClientTask(0, 0, ETA, 1.0, {"x": x_t}, None)
        ctx = LocalContext(task, ClientData(1, CLIENTS[0].grad_fn), spec, client_stream(0, 0, 0),
                           None)
        moves[mu] = float((x_t - run_client(algo, task, ctx).model).norm())
    grad_norm = float((A[0] * x_t - B[0]).norm())
    # the prox point satisfies ‖y − x_t‖ = ‖(A + μI)⁻¹ ∇f(x_t)‖ ≤ ‖∇f(x_t)‖ / μ
    assert moves[15.0] <= grad_norm / 15.0 * (1 + 1e-9)
    assert moves[15.0] < 0.2 * moves[0.0]


def test_fednova_equal_steps_is_fedavg():
    clients = [quadratic_client(A[i], B[i], n=i + 1) for i in range(N)]  # unequal weights
    _, ref, _, _ = run("fedavg", 10, clients=clients, weighting="samples")
    _, st, hist, _ = run("fednova", 10, clients=clients, weighting="samples")
    assert torch.allclose(st.x, ref.x, atol=1e-13)
    assert hist[-1]["tau_eff"] == pytest.approx(K)


def _gd_delta(i, x, k):
    """Δ_i after k full-batch GD steps on f_i from x (closed form on a diagonal quadratic)."""
    return (1 - (1 - ETA * A[i]) ** k) * (x - B[i] / A[i])


def test_fednova_unequal_steps():
    steps = [1, 3, 5, 8]  # one epoch of batch size 1 ⇒ K_i = n_i
    clients = [quadratic_client(A[i], B[i], n=steps[i]) for i in range(N)]
    spec = LocalSpec(epochs=1, batch_size=1)
    _, st, _, _ = run("fednova", 1, clients=clients, spec=spec, weighting="samples")
    p = torch.tensor(steps, dtype=F64) / sum(steps)
    tau_eff = float((p * torch.tensor(steps, dtype=F64)).sum())
    d = sum(p[i] * _gd_delta(i, X0, steps[i]) / steps[i] for i in range(N))
    assert torch.allclose(st.x, X0 - tau_eff * d, atol=1e-13)
    fedavg_x = X0 - sum(p[i] * _gd_delta(i, X0, steps[i]) for i in range(N))
    assert (st.x - fedavg_x).norm() > 1e-2


def test_fednova_momentum_normaliser():
    """Constant gradients g_i: momentum SGD moves η ‖a_i‖₁ g_i, so d_i = η g_i exactly."""
    rho, steps = 0.9, [2, 4, 7, 11]
    zeros = torch.zeros(D, dtype=F64)
    clients = [quadratic_client(zeros, B[i], n=steps[i]) for i in range(N)]  # f_i = −b_iᵀx
    spec = LocalSpec(epochs=1, batch_size=1, momentum=rho)
    _, st, _, _ = run("fednova", 1, clients=clients, spec=spec)
    # ‖a_i‖₁ by brute force: step k applies Σ_{j≤k} ρ^{k−j} to gradient j
    a = [sum(rho ** (k - j) for k in range(kk) for j in range(k + 1)) for kk in steps]
    tau_eff = sum(a) / N
    expected = X0 - tau_eff * ETA * sum(-B[i] for i in range(N)) / N
    assert torch.allclose(st.x, expected, atol=1e-12)


# ----- SCAFFOLD with partial participation -------------------------------------------------------

def test_scaffold_control_variate_is_the_gradient_under_momentum():
    """Constant gradients g_i = −b_i: option II's c_i⁺ must be g_i whatever the local momentum."""
    zeros = torch.zeros(D, dtype=F64)
    clients = [quadratic_client(zeros, B[i]) for i in range(N)]  # f_i = −b_iᵀx
    for rho in (0.0, 0.5, 0.9):
        _, _, _, cstates = run("scaffold", 1, clients=clients,
                               spec=LocalSpec(steps=K, batch_size=1, momentum=rho))
        for i in range(N):
            assert torch.allclose(cstates[i].algorithm["c"], -B[i], atol=1e-12), rho


def test_scaffold_reaches_optimum_with_local_momentum():
    """Normalising by K_i instead of ‖a_i‖₁ makes this run diverge (≈1e103 after 400 rounds)."""
    spec = LocalSpec(steps=K, batch_size=1, momentum=0.9)
    _, state, _, _ = run("scaffold", 400, spec=spec)
    assert (state.x - X_STAR).norm() < 1e-9
    _, fedavg, _, _ = run("fedavg", 400, spec=spec)
    assert (fedavg.x - X_STAR).norm() > 0.1


def test_scaffold_server_control_uses_returned_count():
    algo = make("scaffold", num_clients=4)
    c = torch.tensor([0.4, -0.4, 1.0], dtype=F64)
    state = with_state(init(algo, torch.zeros(3, dtype=F64)), c=c)
    dcs = [torch.tensor(v, dtype=F64) for v in ([1.0, 0.0, 2.0], [3.0, -1.0, 0.0],
                                                 [2.0, 4.0, 1.0])]
    agg = agg_of([torch.zeros(3, dtype=F64)] * 3, [1.0] * 3, num_clients=4,
                 extras={"dc": sum(dcs)})
    agg = dataclasses.replace(agg, num_sampled=4)  # 4 dispatched, one dropped
    new, m = update(algo, state, agg, 0)
    # (|S_t| / N) · mean(Δc_i) with |S_t| = 3 returned of N = 4
    assert torch.allclose(new.algorithm.c, c + (3 / 4) * sum(dcs) / 3)
    assert m["c_norm"] == pytest.approx(float(new.algorithm.c.norm()))


def test_scaffold_c_is_mean_of_all_client_variates():
    g = torch.Generator().manual_seed(3)
    picks = [sorted(torch.randperm(N, generator=g)[:2].tolist()) for _ in range(12)]
    algo = make("scaffold")
    state, _, cstates = simulate(algo, X0, CLIENTS, SPEC, 12, ETA, sample=lambda t: picks[t])
    c_all = sum(cstates[i].algorithm["c"] if i in cstates else torch.zeros(D, dtype=F64)
                for i in range(N)) / N
    assert torch.allclose(state.algorithm.c, c_all, atol=1e-12)


# ----- dtype, registry, config -------------------------------------------------------------------

NAMES = ["fedavgm", "fedprox", "scaffold", "feddyn", "fedadam", "fedyogi", "fedadagrad",
         "fednova", "adabest", "fedeve"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_preserved_with_partial_participation(name, dtype):
    clients = [quadratic_client(A[i].to(dtype), B[i].to(dtype)) for i in range(N)]
    algo = make(name)
    x0 = torch.zeros(D, dtype=dtype)
    state, hist, cstates = simulate(algo, x0, clients, LocalSpec(steps=3, batch_size=1), 4,
                                    ETA, sample=lambda t: [t % N, (t + 1) % N])
    assert state.x.dtype == dtype and torch.isfinite(state.x).all()
    assert algo.deployed(state.x, state.algorithm).dtype == dtype
    for cs in cstates.values():
        assert set(cs.algorithm) == set(algo.traits.client_state)
        assert all(v.dtype == dtype for v in cs.algorithm.values())


@pytest.mark.parametrize("name", NAMES)
def test_params_documented(name):
    cls = registry.get(name)
    assert issubclass(cls.Params, ServerParams) and cls.name == name
    for f in dataclasses.fields(cls.Params):
        assert f.metadata.get("doc"), f"{name}.{f.name} has no doc"
    assert schema.build(cls.Params, {}, "algorithm") == cls.Params()


@pytest.mark.parametrize("name,key,value", [
    ("fedavgm", "momentum", 1.0),
    ("fedprox", "mu", -0.1),
    ("scaffold", "server_lr", 0.0),
    ("feddyn", "alpha", 0.0),
    ("fedadam", "beta2", 1.0),
    ("fedyogi", "tau", 0.0),
    ("fedadagrad", "beta1", -0.5),
    ("fednova", "server_lr", 0.0),
    ("adabest", "beta", 1.5),
    ("adabest", "mu", -1.0),
    ("fedeve", "server_lr", -1.0),
    ("fedadagrad", "beta2", 0.9),  # FedAdagrad has no β2
])
def test_config_validation_names_the_key(name, key, value):
    with pytest.raises(ConfigError) as err:
        schema.build(registry.get(name).Params, {key: value}, "algorithm")
    assert err.value.key == f"algorithm.{key}"


# ----- typed client state ------------------------------------------------------------------------
class _Remembers(registry.get("fedavg")):
    """FedAvg whose clients keep what ``returned`` gives them (to test the declaration)."""

    traits = dataclasses.replace(registry.get("fedavg").traits,
                                 client_state={"y": "model", "steps": "scalar"})
    returned = staticmethod(lambda y, steps: {"y": y.clone(), "steps": y.new_tensor(steps)})

    def client_train(self, task, ctx):
        from rayfl.algorithms.base import ClientResult

        y = ctx.train()
        return ClientResult(y, {}, self.returned(y, ctx.steps))


@pytest.mark.parametrize("returned, message", [
    (lambda y, steps: {"y": y.clone(), "count": steps}, r"'count' is not declared"),
    (lambda y, steps: {"y": y[:2].clone()}, r"'y' is declared 'model' but is a tensor of "
                                            r"shape \(2,\), not a vector of 5"),
    (lambda y, steps: {"y": y.clone(), "steps": y.clone()}, r"'steps' is declared 'scalar'"),
])
def test_a_client_state_off_its_declaration_stops_the_run_naming_the_entry(returned, message):
    algo = _Remembers()
    algo.returned = returned
    clients = [quadratic_client(A[i], B[i]) for i in range(N)]
    with pytest.raises(ComponentError, match=message):
        simulate(algo, torch.zeros(D, dtype=F64), clients, LocalSpec(steps=2), 1, ETA)
    ok = _Remembers()  # as declared: stored and handed back
    _, _, cstates = simulate(ok, torch.zeros(D, dtype=F64), clients, LocalSpec(steps=2), 2, ETA)
    assert all(set(cs.algorithm) == {"y", "steps"} for cs in cstates.values())
