"""Sharpness-aware, extrapolating and fair algorithms on quadratics, against answers derived
independently of the code: closed-form fixed points, hand-computed rounds, limit cases.

Quadratic clients f_i(x) = ½ xᵀ diag(a_i) x − b_iᵀ x, full-batch steps, float64 (the classic
suite's problem).
"""

from __future__ import annotations

import pytest
import torch

from rayfl.runtime.harness import simulate
from rayfl.runtime.local import LocalSpec
from tests.test_algorithms_classic import (A, B, CLIENTS, ETA, F64, K, SPEC, X0, X_STAR,
                                           fedavg_fixed_point, make, run)

ONES = torch.ones_like(X0)


def gd_end(i: int, x: torch.Tensor, steps: int = K) -> torch.Tensor:
    """Client i after ``steps`` gradient steps from x, in closed form: x* + (1 − ηa)^K (x − x*)."""
    x_i = B[i] / A[i]
    return x_i + (1 - ETA * A[i]) ** steps * (x - x_i)


# ----- FedSpeed -----------------------------------------------------------------------------

def test_fedspeed_without_perturbation_reaches_the_optimum_fedavg_misses():
    _, state, _, cstates = run("fedspeed", 300, rho=0.0, lam=1.0)
    assert torch.allclose(state.x, X_STAR, atol=1e-9, rtol=0)
    assert (fedavg_fixed_point() - X_STAR).norm() > 0.1
    # at the fixed point each prox-correction is the client's gradient and they cancel
    g_hat = torch.stack([cstates[i].algorithm["g_hat"] for i in range(len(CLIENTS))])
    assert torch.allclose(g_hat, A * X_STAR - B, atol=1e-8)
    assert torch.allclose(g_hat.sum(0), torch.zeros_like(X0), atol=1e-8)


def test_fedspeed_without_perturbation_is_feddyn_byte_for_byte():
    """The prox-correction is FedDyn's ĝ_i with α = 1/λ and the server is FedDyn's."""
    sample = lambda t: [t % 4, (t + 1) % 4]  # noqa: E731 (partial participation)
    algos = make("fedspeed", rho=0.0, lam=4.0), make("feddyn", alpha=0.25)
    (a, _, ca), (b, _, cb) = (simulate(algo, X0, CLIENTS, SPEC, 12, ETA, sample=sample)
                              for algo in algos)
    assert torch.equal(a.x, b.x) and torch.equal(a.algorithm.h, b.algorithm.h)
    assert all(torch.equal(ca[i].algorithm["g_hat"], cb[i].algorithm["g_hat"]) for i in ca)


@pytest.mark.parametrize("alpha", [1.0, 0.3])
def test_fedspeed_first_round_by_hand(alpha):
    """One step (K = 1) of each client from x₀ = 1: g̃₁, the ascent point, the merged gradient,
    then x̂_i = y_i − λ ĝ_i = 2 y_i − x₀ (ĝ_i⁰ = 0); under full participation the server's
    model is the plain mean of the x̂_i (the paper's form)."""
    rho, lam = 0.2, 4.0
    spec = LocalSpec(steps=1, batch_size=1)
    algo = make("fedspeed", rho=rho, alpha=alpha, lam=lam)
    state, _, cstates = simulate(algo, ONES.clone(), CLIENTS, spec, 1, ETA)
    outs, ghats = [], []
    for i in range(len(CLIENTS)):
        g1 = A[i] * ONES - B[i]
        g2 = A[i] * (ONES + rho * g1 / g1.norm()) - B[i]
        y = ONES - ETA * ((1 - alpha) * g1 + alpha * g2)
        ghats.append(-(y - ONES) / lam)
        outs.append(y - lam * ghats[-1])
    assert torch.allclose(state.x, torch.stack(outs).mean(0), atol=1e-12)
    assert torch.allclose(cstates[0].algorithm["g_hat"], ghats[0], atol=1e-12)


# ----- FedExP -------------------------------------------------------------------------------

def test_fedexp_with_a_huge_epsilon_is_fedavg_byte_for_byte():
    _, ref, _, _ = run("fedavg", 20)
    _, st, hist, _ = run("fedexp", 20, eps=1e30)
    assert torch.equal(st.x, ref.x)
    assert all(h["server_lr"] == 1.0 for h in hist)


def test_fedexp_server_step_by_hand():
    """η_g = max(1, mean‖Δ_i‖² / 2(‖Δ̄‖² + ε)) from the clients' closed-form GD updates."""
    eps = 1e-3
    _, st, hist, _ = run("fedexp", 1, eps=eps)
    deltas = torch.stack([X0 - gd_end(i, X0) for i in range(len(CLIENTS))])
    mean = deltas.mean(0)
    eta = max(1.0, float((deltas * deltas).sum(1).mean()) / (2 * (float(mean @ mean) + eps)))
    assert hist[0]["server_lr"] == pytest.approx(eta, rel=1e-12)
    assert torch.allclose(st.x, X0 - eta * mean, atol=1e-12)
    algo = make("fedexp", eps=eps)  # the paper's evaluated model: the mean of the last two
    assert torch.equal(algo.extra_models(st.x, st.algorithm)["last_two"], (st.x + X0) / 2)


def test_fedexp_extrapolates_when_updates_disagree():
    """Two clients pulling in opposite directions: ‖Δ̄‖ ≪ ‖Δ_i‖, so η_g > 1 (the paper's case)."""
    _, _, hist, _ = run("fedexp", 5, eps=0.0)
    assert all(h["server_lr"] >= 1.0 for h in hist) and max(h["server_lr"] for h in hist) > 1.0


# ----- q-FedAvg -----------------------------------------------------------------------------

def test_qfedavg_with_q_zero_is_uniform_fedavg():
    _, ref, _, _ = run("fedavg", 20)
    _, st, _, _ = run("qfedavg", 20, q=0.0)
    assert torch.allclose(st.x, ref.x, atol=1e-12, rtol=0)


@pytest.mark.parametrize("q", [1.0, 2.0])
def test_qfedavg_first_round_by_hand(q):
    """Algorithm 2 of the paper with L = 1/η, F_k(x₀) the closed-form loss at x₀ = 1."""
    algo = make("qfedavg", q=q)
    state, _, _ = simulate(algo, ONES.clone(), CLIENTS, SPEC, 1, ETA)
    lip, num, den = 1 / ETA, torch.zeros_like(X0), 0.0
    for i in range(len(CLIENTS)):
        f = float(0.5 * (A[i] * ONES * ONES).sum() - B[i] @ ONES)
        dw = lip * (ONES - gd_end(i, ONES))
        num += f**q * dw
        den += q * f ** (q - 1) * float(dw @ dw) + lip * f**q
    assert torch.allclose(state.x, ONES - num / den, atol=1e-12)


def test_qfedavg_favours_the_clients_with_higher_loss():
    """On clients whose losses stay positive, a larger q moves the fixed point towards the
    worst-off client: its loss falls and the spread of losses narrows."""
    clients_a, clients_b = A.clone(), B.clone()
    shift = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=F64)  # f_i + c_i: losses stay positive

    from rayfl.runtime.harness import Client

    def client(i):
        def grad_fn(point, idx):
            loss = 0.5 * (clients_a[i] * point * point).sum() - clients_b[i] @ point + shift[i]
            return loss, clients_a[i] * point - clients_b[i]
        return Client(grad_fn, 1)

    clients = [client(i) for i in range(len(CLIENTS))]

    def losses(q):
        _, st, _, _ = run("qfedavg", 400, clients=clients, q=q)
        x = st.x
        return torch.stack([0.5 * (A[i] * x * x).sum() - B[i] @ x + shift[i]
                            for i in range(len(CLIENTS))])

    fair, plain = losses(5.0), losses(0.0)
    assert fair.max() < plain.max() and fair.std() < plain.std()


# ----- Per-FedAvg ---------------------------------------------------------------------------

def perfedavg_end(i: int, x: torch.Tensor, alpha: float, variant: str) -> torch.Tensor:
    """K meta-steps of client i by hand: w̃ = w − α ∇f(w), g = ∇f(w̃), and for HF
    g − α ∇²f(w) g with the quadratic's exact Hessian diag(a_i)."""
    w = x.clone()
    for _ in range(K):
        g = A[i] * (w - alpha * (A[i] * w - B[i])) - B[i]
        if variant == "hf":
            g = g - alpha * A[i] * g
        w = w - ETA * g
    return w


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_first_round_by_hand(variant):
    """Full-batch quadratics (every minibatch is the client's one row): the finite-difference
    Hessian-vector product of HF is exact up to rounding."""
    alpha = 0.05
    _, st, _, _ = run("perfedavg", 1, alpha=alpha, variant=variant)
    ends = torch.stack([perfedavg_end(i, X0, alpha, variant) for i in range(len(CLIENTS))])
    assert torch.allclose(st.x, ends.mean(0), atol=1e-7 if variant == "hf" else 1e-12)


def test_perfedavg_without_adaptation_is_fedavg_on_full_batches():
    """α = 0 (FO): w̃ = w, so each meta-step is a plain gradient step (on the second of its
    two minibatches, which on one-row clients is the same row)."""
    _, ref, _, _ = run("fedavg", 10)
    _, st, _, _ = run("perfedavg", 10, alpha=0.0)
    assert torch.equal(st.x, ref.x)


def test_perfedavg_meta_steps_draw_two_or_three_minibatches(tiny):
    """A meta-step draws two (FO) or three (HF) minibatches from the client's seeded stream, so
    a round reports two or three times FedAvg's local steps for the same K."""
    import rayfl
    from tests.conftest import TINY

    def steps(*extra):
        result = rayfl.run(TINY, tiny + ["rounds=1", "runtime.executor=inprocess", *extra],
                           quiet=True)
        return result.metrics.column("local_steps").to_pylist()[0]

    plain = steps("algorithm.name=fedavg")
    assert steps("algorithm.name=perfedavg") == 2 * plain
    assert steps("algorithm.name=perfedavg", "algorithm.variant=hf") == 3 * plain
