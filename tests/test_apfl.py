"""APFL: the global model is FedAvg's whatever α, the personal model and α follow Algorithm 1
in closed form on a quadratic, the evaluated model is the mix (personal scores independent of
the actor count: tests/test_client_eval.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import rayfl
from rayfl.algorithms.apfl import APFL, APFLParams
from rayfl.runtime.harness import quadratic_client, simulate
from rayfl.runtime.local import LocalSpec
from tests.conftest import TINY

APFL_NAME = "algorithm.name=apfl"


def _run(tiny, *overrides):
    return rayfl.run(TINY, [*tiny, "runtime.executor=inprocess", "rounds=3", *overrides],
                     quiet=True)


@pytest.mark.parametrize("alpha", ["0", "0.5"])
def test_global_model_is_fedavgs_whatever_alpha(tiny, alpha):
    fedavg = _run(tiny, "algorithm.name=fedavg").summary["model_sha256"]
    apfl = _run(tiny, APFL_NAME, f"algorithm.alpha={alpha}").summary["model_sha256"]
    assert apfl == fedavg


def test_batchnorm_statistics_uploaded_are_those_of_ws_training(tiny):
    """The mixed model's gradient must not leave its BatchNorm statistics in the upload."""
    bn = ["model.name=examples.bn_model:BNNet", "data.partition=iid"]
    runs = [_run(tiny, *bn, f"name={name}", *extra) for name, extra in
            (("fedavg", ["algorithm.name=fedavg"]),
             ("apfl", [APFL_NAME, "algorithm.alpha=0.5", "algorithm.adaptive=true"]))]
    for f in ("final_model.npy", "final_buffers.npy"):
        fedavg, apfl = (np.load(os.path.join(r.run_dir, f)) for r in runs)
        assert np.array_equal(fedavg, apfl), f


@pytest.mark.parametrize("alpha, adaptive", [(0.5, False), (0.5, True), (1.0, False)])
def test_one_round_follows_algorithm_1_in_closed_form(alpha, adaptive):
    """Quadratic f(z) = ½ a z² − b z per coordinate (gradient a z − b), K full-batch steps."""
    a, b = torch.tensor([1.0, 3.0]), torch.tensor([2.0, -1.0])
    spec, lr, k = LocalSpec(steps=4, batch_size=1), 0.1, 4
    state, _, states = simulate(APFL(APFLParams(alpha=alpha, adaptive=adaptive)), torch.zeros(2),
                                [quadratic_client(a, b)], spec, rounds=1, lr0=lr)
    w = torch.zeros(2)  # the round's global model, where w and v start
    v, mix = w.clone(), alpha
    for _ in range(k):
        v_bar = mix * v + (1 - mix) * w
        g_v = a * v_bar - b
        new_mix = min(1.0, max(0.0, mix - lr * float((v - w) @ g_v)))
        w, v = w - lr * (a * w - b), v - lr * mix * g_v
        if adaptive:
            mix = new_mix
    assert torch.allclose(states[0].algorithm["v"], v, atol=1e-6)
    assert states[0].algorithm["alpha"].shape == (1,)
    assert states[0].algorithm["alpha"].item() == pytest.approx(mix, abs=1e-6)
    assert torch.allclose(state.x, w, atol=1e-6)  # one client: the global step is its SGD
    if adaptive:
        assert mix != alpha  # the check above saw α move
    if alpha == 1.0:  # pure local training of v
        z = torch.zeros(2)
        for _ in range(k):
            z = z - lr * (a * z - b)
        assert torch.allclose(states[0].algorithm["v"], z, atol=1e-6)


def test_personal_model_mixes_v_with_the_current_global_model():
    v, x = torch.tensor([1.0, -2.0, 4.0]), torch.tensor([0.5, 3.0, -1.0])
    own, buffers = APFL().personal_model({"v": v, "alpha": torch.tensor([0.3])}, x)
    assert torch.allclose(own, 0.3 * v + 0.7 * x) and buffers is None
    own, buffers = APFL().personal_model(None, x)
    assert torch.equal(own, x) and buffers is None
