"""Robust aggregation rules and attackers: the rules against numpy and their papers' limit
cases, attackers as a seeded set, one and two actors alike, refusals where the math breaks."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rayfl import config as config_mod
from rayfl import run
from rayfl.algorithms.base import Aggregate
from rayfl.schema import ConfigError
from rayfl.algorithms.base import ServerRound
from rayfl.layers import Facts
from rayfl.transforms import ClientContext
from rayfl.transforms.robust import (Attack, AttackParams, Krum, KrumParams, Median,
                                     TrimmedMean, TrimmedMeanParams)
from tests.conftest import TINY

ROUNDS = ["rounds=6", "clients_per_round=10", "runtime.executor=inprocess"]  # Ray: below


def _agg(updates: torch.Tensor) -> Aggregate:
    m = len(updates)
    return Aggregate(m, m, 20, float(m), updates.mean(0), updates.sum(0),
                     float((updates * updates).sum()), {}, updates=updates)


def _mean(rule, updates: torch.Tensor) -> torch.Tensor:
    """The rule's server half on a round of ``updates``: the mean the algorithm sees."""
    return _server(rule, updates)[0].delta_mean


def _server(rule, updates: torch.Tensor):
    srv = ServerRound(0, updates[0], 20, None, None)
    return rule.aggregate(rule.init(None), _agg(updates), {}, srv)


@pytest.mark.parametrize("m", [7, 8])
def test_median_is_numpys(m):
    u = torch.randn(m, 300, generator=torch.Generator().manual_seed(m), dtype=torch.float64)
    got = _mean(Median(), u)
    assert torch.allclose(got, torch.from_numpy(np.median(u.numpy(), axis=0)), atol=1e-15)


def test_trimmed_mean_drops_each_end_and_is_the_mean_without_trimming():
    u = torch.randn(10, 50, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    got = _mean(TrimmedMean(TrimmedMeanParams(beta=0.2)), u)
    kept = np.sort(u.numpy(), axis=0)[2:8]  # ⌊0.2·10⌋ = 2 at each end
    assert torch.allclose(got, torch.from_numpy(kept.mean(0)), atol=1e-15)
    plain = _mean(TrimmedMean(TrimmedMeanParams(beta=0.0)), u)
    assert torch.allclose(plain, u.mean(0), atol=1e-15)


def test_krum_picks_an_honest_update_and_multikrum_averages_the_honest_ones():
    """Seven honest clients near c, two attackers far away (f = 2, m = 9 > 2f + 2)."""
    g = torch.Generator().manual_seed(0)
    c = torch.full((20,), 0.5, dtype=torch.float64)
    honest = c + 0.01 * torch.randn(7, 20, generator=g, dtype=torch.float64)
    u = torch.cat([honest[:3], 50 + torch.randn(2, 20, generator=g, dtype=torch.float64),
                   honest[3:]])
    one = _mean(Krum(KrumParams(byzantine=2)), u)
    assert any(torch.equal(one, h) for h in honest)
    multi = _mean(Krum(KrumParams(byzantine=2, select=7)), u)
    assert torch.allclose(multi, honest.mean(0), atol=1e-14)


def test_krum_with_too_few_updates_is_the_mean_and_says_so():
    u = torch.randn(4, 5, dtype=torch.float64)
    krum = Krum(KrumParams(byzantine=1))
    agg, slot, metrics = _server(krum, u)
    assert torch.allclose(agg.delta_mean, u.mean(0))
    assert metrics == {"krum_fallbacks": 1.0, "krum_clamped": 0.0} and slot.fallbacks == 1


def test_multikrum_in_a_round_short_of_select_averages_its_m_minus_f_best_and_says_so():
    """Seven honest updates near c, two far away, f = 2, k = 8 > m − f = 7 (a round where
    clients dropped): the mean of the seven honest ones, counted in krum_clamped."""
    g = torch.Generator().manual_seed(1)
    honest = 0.5 + 0.01 * torch.randn(7, 20, generator=g, dtype=torch.float64)
    u = torch.cat([honest, 50 + torch.randn(2, 20, generator=g, dtype=torch.float64)])
    krum = Krum(KrumParams(byzantine=2, select=8))
    agg, _, metrics = _server(krum, u)
    assert torch.allclose(agg.delta_mean, honest.mean(0), atol=1e-14)
    assert metrics == {"krum_fallbacks": 0.0, "krum_clamped": 1.0}


@pytest.mark.parametrize("extra, key, expected", [
    # 10 clients a round: m − f = 10 − 1 = 9 is the most Multi-Krum may average
    (["clients_per_round=10", "{name: krum, byzantine: 1, select: 10}"],
     "aggregation.transforms[0].select", "at most m − f = 9"),
    # 2f + 2 < m: with 6 clients f ≤ 1
    (["clients_per_round=6", "{name: krum, byzantine: 2}"],
     "aggregation.transforms[0].byzantine", "at most 1 with 6 updates"),
    (["clients_per_round=2", "{name: krum, byzantine: 0}"], "clients_per_round", "at least 3"),
    (["clients_per_round=10", "aggregation.mode=fedbuff", "aggregation.buffer_size=4",
      "{name: krum, byzantine: 1}"], "aggregation.transforms[0].byzantine", "at most 0"),
    (["aggregation.mode=fedasync", "{name: krum, byzantine: 0}"], "aggregation.mode",
     "sync or fedbuff"),
])
def test_krum_refuses_a_config_whose_rounds_can_never_meet_it(extra, key, expected):
    overrides = [e for e in extra if not e.startswith("{")]
    entry = next(e for e in extra if e.startswith("{"))
    with pytest.raises(ConfigError, match=f"'{re.escape(key)}'.*{expected}"):
        config_mod.load(TINY, [*overrides, _transforms(entry)])


def test_krum_accepts_the_most_a_round_allows():
    cfg = config_mod.load(TINY, ["clients_per_round=10",  # 10 > 2·3 + 2 and 4 ≤ 10 − 3
                                 _transforms("{name: krum, byzantine: 3, select: 4}")])
    assert cfg.aggregation.transforms == [{"name": "krum", "byzantine": 3, "select": 4}]
    config_mod.load(TINY, ["clients_per_round=10",
                           _transforms("{name: krum, byzantine: 1, select: 9}")])


def test_attackers_are_a_seeded_set_and_each_kind_corrupts_as_stated():
    attack = Attack(AttackParams(fraction=0.3), Facts(seed=5))
    who = [c for c in range(2000) if attack.is_attacker(c)]
    assert abs(len(who) / 2000 - 0.3) < 0.03
    same = Attack(AttackParams(fraction=0.3), Facts(seed=5))
    assert who == [c for c in range(2000) if same.is_attacker(c)]
    delta, bad, good = torch.randn(10), who[0], next(c for c in range(2000) if c not in who)
    ctx = ClientContext()
    assert torch.equal(attack.client_apply(delta, 0, bad, ctx), -delta)
    assert ctx.payload == {"attackers": 1.0}
    assert torch.equal(attack.client_apply(delta, 0, good, ClientContext()), delta)
    scale = Attack(AttackParams(kind="scale", fraction=0.3, scale=-4.0), Facts(seed=5))
    assert torch.equal(scale.client_apply(delta, 0, bad, ClientContext()), -4.0 * delta)
    noise = Attack(AttackParams(kind="gaussian", fraction=0.3, sigma=2.0), Facts(seed=5))
    a, b = (noise.client_apply(delta, t, bad, ClientContext()) for t in (0, 1))
    assert not torch.equal(a, b) and 1.5 < float(a.std()) < 2.5


def _transforms(*entries: str) -> str:
    return "aggregation.transforms=[" + ", ".join(entries) + "]"


def test_no_attackers_is_no_attack_byte_for_byte(tiny):
    plain = run(TINY, [*tiny, *ROUNDS], quiet=True)
    none = run(TINY, [*tiny, *ROUNDS, _transforms("{name: attack, fraction: 0}")], quiet=True)
    assert none.summary["model_sha256"] == plain.summary["model_sha256"]
    attacked = run(TINY, [*tiny, *ROUNDS, _transforms("{name: attack, fraction: 0.3}")],
                   quiet=True)
    assert attacked.summary["model_sha256"] != plain.summary["model_sha256"]
    assert sum(r["attackers"] for r in attacked.metrics.to_pylist()) > 0


def test_trimming_nothing_under_uniform_weights_is_fedavg(tiny):
    uniform = [*tiny, *ROUNDS, "aggregation.weighting=uniform"]
    plain = run(TINY, uniform, quiet=True)
    trimmed = run(TINY, [*uniform, _transforms("{name: trimmed_mean, beta: 0}")], quiet=True)
    assert np.allclose(trimmed.params, plain.params, atol=1e-6)


def test_a_robust_rule_gives_the_same_bytes_on_one_and_two_actors(tiny, ray_local):
    common = [*tiny, *ROUNDS, _transforms("{name: attack, fraction: 0.3}",
                                          "{name: krum, byzantine: 3, select: 4}")]
    one = run(TINY, common, quiet=True)  # one worker: this process
    two = run(TINY, [*common, "runtime.executor=ray", "runtime.num_actors=2"], quiet=True)
    assert one.summary["model_sha256"] == two.summary["model_sha256"]


@pytest.mark.parametrize("extra, key", [
    (["privacy.noise_multiplier=1", "privacy.clip_norm=1"], "privacy"),
    (["algorithm.name=scaffold"], "algorithm.name"),
])
def test_robust_rules_refuse_what_would_break_their_math(extra, key):
    with pytest.raises(ConfigError, match=key):
        config_mod.load(TINY, [_transforms("{name: median}"), *extra])


def test_a_robust_rule_refuses_secure_aggregation():
    with pytest.raises(ConfigError, match="secagg"):
        config_mod.load(TINY, [_transforms("{name: median}", "{name: secagg}"),
                               "aggregation.weighting=uniform"])


def test_a_robust_rule_acts_in_the_event_driven_mode_too(tiny):
    """FedBuff merges buffered clients' sums: the rule still sees every update and changes the
    model against the plain mean under the same attack."""
    common = [*tiny, *ROUNDS, "aggregation.mode=fedbuff"]
    attack = "{name: attack, fraction: 0.3}"
    plain = run(TINY, [*common, _transforms(attack)], quiet=True)
    robust = run(TINY, [*common, _transforms(attack, "{name: median}")], quiet=True)
    assert robust.summary["model_sha256"] != plain.summary["model_sha256"]
    assert np.isfinite(robust.summary["final_accuracy"])


class FlippedSynthetic:
    """The built-in synthetic set with every training label y replaced by C − 1 − y."""

    @staticmethod
    def load(cfg, seed):
        import dataclasses

        from rayfl.data.datasets import synthetic

        arrays = synthetic.load(cfg, seed)
        return dataclasses.replace(arrays, y_train=cfg.classes - 1 - arrays.y_train)


def test_label_flipping_attackers_train_on_flipped_labels(tiny):
    """Every client a label flipper gives the bytes of honest training on a dataset whose
    training labels are flipped (an iid partition does not read labels); the update itself
    is sent as trained."""
    iid = [*tiny, *ROUNDS, "data.partition=iid"]
    attacked = run(TINY, [*iid, _transforms("{name: attack, kind: label_flip, fraction: 1}")],
                   quiet=True)
    flipped = run(TINY, [*iid, "data.dataset=tests.test_robust:FlippedSynthetic"], quiet=True)
    assert attacked.summary["model_sha256"] == flipped.summary["model_sha256"]
    assert [r["attackers"] for r in attacked.metrics.to_pylist()] == \
        [r["completed"] for r in attacked.metrics.to_pylist()]
    plain = run(TINY, iid, quiet=True)
    assert plain.summary["model_sha256"] != attacked.summary["model_sha256"]
    labels = torch.tensor([0, 1, 2, 3])
    honest = next(c for c in range(100) if not Attack(AttackParams(fraction=0.5)).is_attacker(c))
    assert torch.equal(Attack(AttackParams(kind="label_flip", fraction=0.5))
                       .client_labels(labels, honest, 4), labels)


def test_label_flipping_needs_class_labels():
    from types import SimpleNamespace

    with pytest.raises(ConfigError, match="label_flip needs class labels"):
        Attack.check_data(AttackParams(kind="label_flip"), SimpleNamespace(kind="tokens"),
                          "aggregation.transforms[0]")
    Attack.check_data(AttackParams(kind="label_flip"), SimpleNamespace(kind="dense"),
                      "aggregation.transforms[0]")
