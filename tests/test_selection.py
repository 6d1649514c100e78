"""Client selection: power of choice (Cho, Wang & Joshi, AISTATS 2022) and Oort (Lai et al.,
OSDI 2021) against their stated rules, the candidates' losses against an independent evaluation,
determinism, resume and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rayfl
from rayfl import config as config_mod
from rayfl.rng import SAMPLE
from rayfl.data import prepare
from rayfl.models import build_for
from rayfl.schema import ConfigError
from tests.conftest import TINY
from rayfl.availability import make_sampler
from rayfl.selection import SelectionContext
from rayfl.selection.oort import Oort, OortParams
from tests.test_availability import SPEC, FakeHandle, avail

POC = ["selection.name=power_of_choice"]
OORT = ["selection.name=oort"]


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

    s = make_sampler(avail(), handle, 10, 3, SPEC,
                     selection=config_mod.load({"selection": {"name": "power_of_choice",
                                                              "candidates": d}}).selection)
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
    from rayfl.assemble import worker_parts
    from rayfl.runtime.client_actor import ClientWorker

    cfg = config_mod.load(TINY, tiny + POC)
    handle = prepare(cfg.data, cfg.seed)
    worker = ClientWorker(worker_parts(cfg, handle.num_clients), handle,
                          str(tiny[0].split("=", 1)[1]), 0)
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
    chosen = rayfl.run(TINY, common + POC + ["selection.candidates=12"], quiet=True)
    assert chosen.summary["model_sha256"] != uniform.summary["model_sha256"]
    first = [r["train_loss"] for r in chosen.metrics.to_pylist()][0]
    assert first > [r["train_loss"] for r in uniform.metrics.to_pylist()][0]


def test_power_of_choice_is_the_same_on_any_actor_count_and_after_a_resume(tiny, ray_local,
                                                                          tmp_path):
    common = tiny + POC + ["rounds=5", "selection.candidates=9"]
    two = rayfl.run(TINY, common + ["runtime.num_actors=2", "name=two"], quiet=True)
    one = rayfl.run(TINY, common + ["runtime.executor=inprocess", "name=in"], quiet=True)
    assert one.summary["model_sha256"] == two.summary["model_sha256"]  # 1 worker, 2 actors
    paused = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True,
                       run_dir=str(tmp_path / "paused"), max_rounds=2)
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == one.summary["model_sha256"]


@pytest.mark.parametrize("overrides, key", [
    (["selection.candidates=8"], "selection.candidates"),  # uniform scores none
    (OORT + ["selection.candidates=8"], "selection.candidates"),
    (POC + ["selection.candidates=3"], "selection.candidates"),  # fewer than K = 5
    (POC + ["privacy.noise_multiplier=1.0", "aggregation.weighting=uniform"],
     "selection.name"),
    (OORT + ["privacy.noise_multiplier=1.0", "aggregation.weighting=uniform"],
     "selection.name"),
    (POC + ["aggregation.mode=fedbuff"], "selection.name"),
    (OORT + ["aggregation.mode=fedasync"], "selection.name"),
    (["selection.name=oortt"], "selection.name"),
])
def test_selection_refuses_what_it_cannot_mean(overrides, key):
    with pytest.raises(ConfigError) as err:
        config_mod.load(TINY, overrides)
    assert err.value.key == key


# ----- Oort ---------------------------------------------------------------------------------------
def oort(n=12, **kw):
    """An Oort selector over ``n`` clients with sizes 10..10+n−1 and durations 1..n seconds."""
    sizes = np.arange(10, 10 + n)
    duration = np.arange(1.0, n + 1.0)
    return Oort(OortParams(**kw), SelectionContext(sizes, 0, lambda ids: duration[ids])), \
        sizes, duration


def test_oort_explores_the_largest_fastest_clients_first():
    """Round 1 (nothing explored): every slot explores; with a window of 1 the picks are the
    m largest |B_i| · (T / t_i)^α, T the 30th percentile of the durations."""
    sel, sizes, duration = oort(explore_window=1.0)
    got = sel.select(0, np.random.default_rng(0), np.arange(12), 4, None)
    T = np.percentile(duration, 30, method="lower")
    prior = sizes * np.where(duration > T, (T / duration) ** 2, 1.0)
    assert sorted(got.tolist()) == sorted(np.argsort(-prior)[:4].tolist())


def test_oort_exploits_the_highest_utility_plus_staleness_under_the_straggler_penalty():
    """By hand: util_i = min-max normalised |B_i|·L̄_i + sqrt(0.1 log R / L_i), × (T/t_i)^2 for
    t_i > T; with c = 1 the exploited clients are exactly the top ⌊(1 − ε)m⌋."""
    sel, sizes, duration = oort(exploration=0.5, exploration_decay=1.0, exploration_min=0.0,
                                cutoff=1.0, explore_window=1.0, threshold=50.0)
    losses = {0: 2.0, 3: 0.5, 5: 1.5, 7: 3.0, 9: 1.0, 11: 2.5}
    sel.observe(0, {c: losses[c] for c in (0, 3, 5)})  # round 1
    sel.observe(2, {c: losses[c] for c in (7, 9, 11)})  # round 3
    online = np.arange(12)
    got = sel.select(4, np.random.default_rng(1), online, 6, None)  # round R = 5
    explored = np.array([0, 3, 5, 7, 9, 11])
    u = sizes[explored] * np.array([losses[c] for c in explored])
    last = np.array([1, 1, 1, 3, 3, 3])
    T = np.percentile(duration, 50, method="lower")
    penalty = np.where(duration[explored] > T, (T / duration[explored]) ** 2, 1.0)
    util = ((u - u.min()) / (u.max() - u.min()) + np.sqrt(0.1 * np.log(5) / last)) * penalty
    exploit = set(explored[np.argsort(-util)[:3]].tolist())
    unexplored = np.setdiff1d(online, explored)
    prior = sizes[unexplored] * np.where(duration[unexplored] > T,
                                         (T / duration[unexplored]) ** 2, 1.0)
    explore = set(unexplored[np.argsort(-prior)[:3]].tolist())
    assert set(got.tolist()) == exploit | explore and len(got) == 6


def test_oort_decays_exploration_and_exploits_more_when_few_are_unexplored():
    sel, _, _ = oort(exploration=0.9, exploration_decay=0.5, exploration_min=0.25)
    sel.observe(0, {c: 1.0 for c in range(10)})  # 2 of 12 left unexplored
    rng = np.random.default_rng(0)
    got = sel.select(3, rng, np.arange(12), 8, None)  # ε = max(0.9 · 0.5³, 0.25) = 0.25
    assert len(set(got.tolist())) == 8 and {10, 11} <= set(got.tolist())  # 6 + 2 explore
    sel.observe(3, {10: 1.0, 11: 1.0})
    got = sel.select(4, rng, np.arange(12), 8, None)  # none unexplored: all 8 exploited
    assert len(set(got.tolist())) == 8


def test_oort_pacer_relaxes_the_preferred_duration_when_exploited_utility_falls():
    """Algorithm 1: every W rounds, T ← T + Δ when the exploited utility of the last W rounds
    is below that of the W before; otherwise T stays."""
    sel, _, duration = oort(pacer_window=2, pacer_delta=5.0, threshold=30.0)
    sel.history = [9.0, 9.0, 1.0, 1.0]
    sel._pace(5)  # not a multiple of W
    assert sel.threshold == 30.0
    sel._pace(6)
    assert sel.threshold == 35.0
    assert sel.preferred() == np.percentile(duration, 35, method="lower")
    sel.history = [1.0, 1.0, 9.0, 9.0]
    sel._pace(8)
    assert sel.threshold == 35.0
    sel.observe(0, {c: 1.0 for c in range(12)})
    for t in range(1, 9):  # the window the pacer reads stays 2W long
        sel.select(t, np.random.default_rng(t), np.arange(12), 4, None)
    assert len(sel.history) == 4


def test_oort_state_round_trips_through_a_checkpoint():
    sel, _, _ = oort()
    sel.observe(0, {1: 2.0, 4: float("nan")})  # a client with no step counts as loss 0
    sel.threshold, sel.history = 40.0, [1.0, 2.0]
    again, _, _ = oort()
    again.load_state(sel.state())
    assert again.utility == {1: 11 * 2.0, 4: 0.0} and again.last == {1: 1, 4: 1}
    assert again.threshold == 40.0 and again.history == [1.0, 2.0]
    a = sel.select(3, np.random.default_rng(5), np.arange(12), 5, None)
    b = again.select(3, np.random.default_rng(5), np.arange(12), 5, None)
    assert a.tolist() == b.tolist()


def test_oort_run_prefers_fast_devices_and_is_the_same_on_any_actor_count_and_after_a_resume(
        tiny, ray_local, tmp_path):
    common = tiny + ["rounds=6", "clients_per_round=4", "availability.speed_sigma=1.5"]
    uniform = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True)
    common += ["selection.exploration=0.5"]
    two = rayfl.run(TINY, common + OORT + ["runtime.num_actors=2", "name=two"], quiet=True)
    inproc = rayfl.run(TINY, common + OORT + ["runtime.executor=inprocess"], quiet=True)
    assert inproc.summary["model_sha256"] == two.summary["model_sha256"] != \
        uniform.summary["model_sha256"]  # one worker (this process) and 2 actors
    paused = rayfl.run(TINY, common + OORT + ["runtime.executor=inprocess"], quiet=True,
                       run_dir=str(tmp_path / "paused"), max_rounds=3)
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == inproc.summary["model_sha256"]
    virtual = [r["virtual_time_s"] for r in inproc.metrics.to_pylist()]
    assert virtual[-1] < [r["virtual_time_s"] for r in uniform.metrics.to_pylist()][-1]


def test_a_user_selector_runs_on_ray_actors_and_resumes_with_its_learnt_state(tiny, ray_local,
                                                                               tmp_path):
    """examples/my_selector.py: every client takes part before any takes part twice, on 2
    actors and after a pause/resume with identical bytes."""
    common = tiny + ["rounds=4", "clients_per_round=4",
                     "selection.name=examples.my_selector:LeastSeen"]
    two = rayfl.run(TINY, common + ["runtime.num_actors=2"], quiet=True)
    paused = rayfl.run(TINY, common + ["runtime.executor=inprocess"], quiet=True,
                       run_dir=str(tmp_path / "paused"), max_rounds=2)
    resumed = rayfl.resume(paused.run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == two.summary["model_sha256"]
    cfg = config_mod.load(TINY, common)
    sel = cfg.selection.component()(cfg.selection.params,
                                    SelectionContext(np.ones(8, dtype=np.int64), 0, None))
    rng = np.random.default_rng(0)
    seen = []
    for t in range(4):
        got = sel.select(t, rng, np.arange(8), 4, None)
        sel.observe(t, {int(c): 1.0 for c in got})
        seen.append(set(got.tolist()))
    assert seen[0] | seen[1] == set(range(8)) == seen[2] | seen[3]
