"""pFedMe: the client's two-level update and the server's β step against hand computations on a
quadratic, the inner problem's closed-form limit, the personal model and the recorded loss
(numbers independent of the actor count: tests/test_client_eval.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rayfl.algorithms.base import ClientTask
from rayfl.algorithms.pfedme import PFedMe, PFedMeParams
from rayfl.runtime.context import ClientData, LocalContext
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.training import run_client
from rayfl.runtime.local import LocalSpec

A, B = torch.tensor([1.0, 3.0]), torch.tensor([2.0, -1.0])  # f(z) = ½ a z² − b z per coordinate
LR = 0.1


def _client_round(x, lam, p_lr, k, steps):
    """(w, θ, losses) of one client's round from the global model ``x``, by hand."""
    w, theta, losses = x.clone(), x.clone(), []
    for _ in range(steps):
        for _ in range(k):
            loss = 0.5 * (A * theta * theta).sum() - B @ theta  # the last one is recorded
            theta = theta - p_lr * (A * theta - B + lam * (theta - w))
        losses.append(float(loss))
        w = w - LR * lam * (w - theta)
    return w, theta, losses


SETTINGS = [(15.0, 0.01, 5), (2.0, 0.05, 3)]


@pytest.mark.parametrize("lam, p_lr, k", SETTINGS)
def test_one_round_follows_the_update_by_hand(lam, p_lr, k):
    algorithm = PFedMe(PFedMeParams(lam=lam, personal_lr=p_lr, inner_steps=k))
    state, _, states = simulate(algorithm, torch.zeros(2), [quadratic_client(A, B)],
                                LocalSpec(steps=3, batch_size=1), rounds=1, lr0=LR)
    w, theta, _ = _client_round(torch.zeros(2), lam, p_lr, k, steps=3)
    assert torch.allclose(states[0].algorithm["theta"], theta, atol=1e-6)
    assert torch.allclose(state.x, w, atol=1e-6)  # one client, β = 1: the new x is its w


@pytest.mark.parametrize("lam, p_lr, k", SETTINGS)
def test_the_server_mixes_the_old_model_and_the_clients_by_beta(lam, p_lr, k):
    params = PFedMeParams(lam=lam, personal_lr=p_lr, inner_steps=k, server_lr=0.5)
    state, _, states = simulate(PFedMe(params), torch.zeros(2), [quadratic_client(A, B)],
                                LocalSpec(steps=3, batch_size=1), rounds=2, lr0=LR)
    x = torch.zeros(2)
    for _ in range(2):  # θ restarts from each round's x
        w, theta, _ = _client_round(x, lam, p_lr, k, steps=3)
        x = 0.5 * x + 0.5 * w
    assert torch.allclose(state.x, x, atol=1e-6)
    assert torch.allclose(states[0].algorithm["theta"], theta, atol=1e-6)


def test_many_inner_steps_solve_the_moreau_envelopes_inner_problem():
    lam, x0 = 5.0, torch.tensor([0.5, -1.0])
    algorithm = PFedMe(PFedMeParams(lam=lam, personal_lr=0.05, inner_steps=200))
    state, _, states = simulate(algorithm, x0, [quadratic_client(A, B)],
                                LocalSpec(steps=1, batch_size=1), rounds=1, lr0=LR)
    theta_star = (B + lam * x0) / (A + lam)  # argmin ½ a θ² − b θ + λ/2 (θ − w)², w = x0
    assert torch.allclose(states[0].algorithm["theta"], theta_star, atol=1e-5)
    envelope_grad = lam * (A * x0 - B) / (A + lam)  # ∇F(w) of the quadratic's Moreau envelope
    assert torch.allclose(state.x, x0 - LR * envelope_grad, atol=1e-5)


def test_the_recorded_loss_is_the_last_inner_evaluation_of_each_minibatch():
    algorithm = PFedMe(PFedMeParams(lam=2.0, personal_lr=0.05, inner_steps=3))
    x = torch.tensor([0.5, -1.0])
    task = ClientTask(0, 0, LR, 1.0, {"x": x}, None)
    ctx = LocalContext(task, ClientData(1, quadratic_client(A, B).grad_fn),
                       LocalSpec(steps=4, batch_size=1), np.random.default_rng(0), None)
    run_client(algorithm, task, ctx)
    _, _, losses = _client_round(x, 2.0, 0.05, 3, steps=4)
    assert ctx.steps == 4
    assert ctx.mean_loss() == pytest.approx(np.mean(losses), rel=1e-6)


def test_the_personal_model_is_theta_or_the_global_model_before_any_round():
    algorithm, x = PFedMe(), torch.tensor([1.0, 2.0])
    theta, stats = torch.tensor([3.0, 4.0]), torch.tensor([0.5, 1.5])
    vec, buffers = algorithm.personal_model(None, x)
    assert torch.equal(vec, x) and buffers is None
    vec, buffers = algorithm.personal_model({"theta": theta, "theta_buffers": stats}, x)
    assert torch.equal(vec, theta) and torch.equal(buffers, stats)
    vec, buffers = algorithm.personal_model({"theta": theta, "theta_buffers": torch.zeros(0)}, x)
    assert torch.equal(vec, theta) and buffers is None  # a model without buffers
