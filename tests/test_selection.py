"""Client selection: power of choice (Cho, Wang & Joshi, AISTATS 2022) against its stated rule,
the candidates' losses against an independent evaluation, determinism, resume and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rayfl
from rayfl import config as config_mod
from rayfl.availability.base import SAMPLE
from rayfl.data import prepare
from rayfl.models import build_for
from rayfl.schema import ConfigError
from tests.conftest import TINY
from tests.test_availability import FakeHandle, avail, sampler

POC = ["availability.selection=power_of_choice"]


@pytest.mark.parametrize("d", [10, 25, 40])
def test_power_of_choice_samples_the_highest_loss_of_candidates_drawn_by_size(d):
    """The rule as the paper states it: d candidates without replacement with probability ∝
    n_k, then the m with the largest loss."""
    handle = FakeHandle(40)
    loss = np.random.default_rng(7).random(40)  # client k's loss, seen through the callback
    asked = []

    def losses(ids):
        asked.append(np.asarray(ids))
        return loss[ids]

    s = sampler(handle, k=10, seed=3, selection="power_of_choice", candidates=d)
    plan = s.plan(5, 0.0, losses)
    sizes = handle.sizes()
    drawn = np.random.default_rng([3, 5, SAMPLE]).choice(40, d, replace=False,
                                                         p=sizes / sizes.sum())
    assert sorted(asked[0].tolist()) == sorted(drawn.tolist())
    best = drawn[np.argsort(-loss[drawn])[:10]]
    assert sorted(plan.clients.tolist()) == sorted(best.tolist())
    if d == 10:  # as many candidates as slots: every candidate, whatever its loss
        assert sorted(plan.clients.tolist()) == sorted(drawn.tolist())


def test_candidate_losses_are_each_clients_training_loss_at_the_global_model(tiny):
    """The executor's scores against torch on the client's training rows."""
    from rayfl.runtime.client_actor import ClientWorker

    cfg = config_mod.load(TINY, tiny + POC)
    handle = prepare(cfg.data, cfg.seed)
    worker = ClientWorker(cfg, handle, str(tiny[0].split("=", 1)[1]), 0)
    torch.manual_seed(1)
    module = build_for(cfg.model, handle)
    point = torch.nn.utils.parameters_to_vector(module.parameters()).detach()
    ids = np.array([2, 7, 11])
    got = worker.client_losses(point.numpy(), ids, 64)
    reader = handle.open()
    for c, value in zip(ids, got):
        x, y = reader.tensors(*reader.client(int(c)), "cpu")
        with torch.no_grad():
            expected = torch.nn.functional.cross_entropy(module(x), y)
        assert value == pytest.approx(float(expected), rel=1e-6)


def test_power_of_choice_picks_higher_loss_clients_than_uniform_sampling(tiny):
    common = tiny + ["rounds=6", "runtime.executor=inprocess", "clients_per_round=4"]
    uniform = rayfl.run(TINY, common, quiet=True)
    chosen = rayfl.run(TINY, common + POC + ["availability.candidates=12"], quiet=True)
    assert chosen.summary["model_sha256"] != uniform.summary["model_sha256"]
    first = [r["train_loss"] for r in chosen.metrics.to_pylist()][0]
    assert first > [r["train_loss"] for r in uniform.metrics.to_pylist()][0]


def test_power_of_choice_is_the_same_on_any_actor_count_and_after_a_resume(tiny, ray_local,
                                                                          tmp_path):
    common = tiny + POC + ["rounds=5", "availability.candidates=9"]
    one = rayfl.run(TINY, common + ["runtime.num_actors=1", "name=one"], quiet=True)
    two = rayfl.run(TINY, common + ["runtime.num_actors=2", "name=two"], quiet=True)
    inproc = rayfl.run(TINY, common + ["runtime.executor=inprocess", "name=in"], quiet=True)
    assert one.summary["model_sha256"] == two.summary["model_sha256"] == \
        inproc.summary["model_sha256"]
    paused = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True,
                       run_dir=str(tmp_path / "paused"), max_rounds=2)
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == one.summary["model_sha256"]


@pytest.mark.parametrize("overrides, key", [
    (["availability.candidates=8"], "availability.candidates"),  # uniform scores none
    (POC + ["availability.candidates=3"], "availability.candidates"),  # fewer than K = 5
    (POC + ["privacy.noise_multiplier=1.0", "aggregation.weighting=uniform"],
     "availability.selection"),
    (POC + ["aggregation.mode=fedbuff"], "availability.selection"),
])
def test_selection_refuses_what_it_cannot_mean(overrides, key):
    with pytest.raises(ConfigError) as err:
        config_mod.load(TINY, overrides)
    assert err.value.key == key
