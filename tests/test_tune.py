"""The Optuna layer without Ray: study validation, search spaces, objective, storage hand-back."""

from __future__ import annotations

import os
import time
import warnings

import optuna
import pytest
from optuna.trial import TrialState

from rayfl import config as config_mod
from rayfl.schema import ConfigError
from tests.conftest import ROOT, TINY
from tune import space, spec
from tune import study as study_mod
from tune.trial import bundles


def _study(tmp_path, **extra) -> dict:
    raw = {"base": TINY, "dir": str(tmp_path / "study"),
           "overrides": ["algorithm.name=fedmim", f"data.cache_dir={tmp_path / 'cache'}"],
           "presets": ["fedmim"], "objective": {"metric": "test_accuracy"}}
    raw.update(extra)
    return raw


def _build(raw: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the test-set objective's leakage warning
        return spec.build(raw)


def test_fedmim_weights_always_sum_below_one(tmp_path):
    preset = _build(_study(tmp_path))
    assert preset.params["algorithm.alpha"].size == 2  # from the base config's list
    weights = {"type": "weights", "low": 0.0, "size": 3}
    setup = _build(_study(tmp_path, space={"algorithm.alpha": {**weights, "high": 0.999},
                                           "algorithm.beta": {**weights, "high": 1.0}}))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(300):
        values = space.suggest(study.ask(), setup.params)
        alpha, beta = values["algorithm.alpha"], values["algorithm.beta"]
        assert len(alpha) == 3 and min(alpha) >= 0 and sum(alpha) <= 0.999 < 1
        assert len(beta) == 3 and min(beta) >= 0 and sum(beta) <= 1.0 + 1e-12
        config_mod.from_dict(space.apply(setup.base, values))  # FedMIM's own check passes


def test_enqueued_weights_round_trip(tmp_path):
    setup = _build(_study(tmp_path, enqueue=[{"algorithm.alpha": [0.6, 0.3]}]))
    (params,) = setup.enqueued
    rebuilt = space.stick(params["algorithm.alpha.total"], [params["algorithm.alpha.split1"]])
    assert rebuilt == pytest.approx([0.6, 0.3])


@pytest.mark.parametrize("extra, key, words", [
    ({"presets": ["adabest"]}, "presets", "algorithm.name: adabest"),
    ({"space": {"algorithm.alpha": {"type": "weights", "low": 0.0, "high": 1.0}}},
     "space.algorithm.alpha", "summing to less than 1"),
    ({"space": {"algorithm.nope": {"low": 0.0, "high": 1.0}}}, "space.algorithm.nope",
     "no such key"),
    ({"space": {"local.lr": {"low": 0.0, "high": 1.0, "log": True}}}, "space.local.lr.log",
     "low > 0"),
    ({"space": {"local.lr": {"low": 0.5, "high": 0.1}}}, "space.local.lr.high", "above low"),
    ({"space": {"local.epochs": {"type": "int", "low": 0, "high": 4}}}, "space.local.epochs",
     "[1, 10000]"),
    ({"enqueue": [{"local.lr": 0.1}]}, "enqueue[0].local.lr", "a searched key"),
    ({"enqueue": [{"algorithm.alpha": [0.9, 0.3]}]}, "enqueue[0].algorithm.alpha",
     "sum in [0, 0.95]"),
    ({"objective": {"metric": "test_accuracy", "reduce": "rounds_to_target"}},
     "objective.target", "rounds_to_target"),
    ({"trails": 3}, "trails", "no such key"),
    ({"parallel": 0}, "parallel", "[1, inf)"),
    ({"pruner": {"name": "asha"}}, "pruner.name", "'median', 'hyperband', 'none'"),
])
def test_bad_studies_name_key_value_and_expectation(tmp_path, extra, key, words):
    with pytest.raises(ConfigError) as err:
        _build(_study(tmp_path, **extra))
    assert err.value.key == key
    assert words in err.value.expected


def test_test_set_objective_is_a_warned_opt_in(tmp_path):
    with pytest.warns(UserWarning, match="leakage"):
        spec.build(_study(tmp_path))


def test_validation_objective_needs_validation_clients(tmp_path):
    raw = _study(tmp_path, objective={"metric": "val_accuracy"})
    with pytest.raises(ConfigError) as err:
        spec.build(raw)
    assert err.value.key == "objective.metric" and "validation_clients" in err.value.expected
    raw["overrides"].append("data.validation_clients=4")
    assert spec.build(raw).spec.objective.metric == "val_accuracy"  # no leakage warning


def test_objective_reductions():
    evals = [(1, 0.2), (2, 0.5), (3, 0.4), (4, 0.7)]
    obj = spec.ObjectiveSpec
    assert obj().value(evals) == 0.7
    assert obj(reduce="mean_last_k", last_k=3).value(evals) == pytest.approx(0.5 + 0.1 / 3)
    reach = obj(reduce="rounds_to_target", target=0.45)
    assert reach.value(evals) == 2 and reach.study_direction == "minimize"
    assert reach.value(evals[:1]) == 2  # not reached after 1 round: at least 2
    assert obj(reduce="rounds_to_target", target=0.9).value(evals) == 5  # never: rounds + 1
    loss = obj(metric="val_loss", reduce="rounds_to_target", target=0.3)
    assert loss.metric_direction == "minimize" and loss.value(evals) == 1


def test_stale_trials_are_requeued_and_not_counted(tmp_path):
    setup = _build(_study(tmp_path, enqueue=[{"algorithm.alpha": [0.5, 0.2]}]))
    study = study_mod.open_study(setup)
    assert os.path.isfile(os.path.join(setup.dir, "optuna.log"))
    done = study.ask()  # the enqueued trial
    space.suggest(done, setup.params)
    study.tell(done, 0.5)
    dead = study.ask()
    space.suggest(dead, setup.params)
    dead.set_user_attr("heartbeat", time.time() - 1000)  # its process died long ago
    alive = study.ask()
    space.suggest(alive, setup.params)
    alive.set_user_attr("heartbeat", time.time())
    assert study_mod.counts(study) == (1, 2)

    again = study_mod.open_study(setup)  # the same command, later
    study_mod.fail_stale(again, own=set(), stale_after_s=60)
    trials = again.get_trials()
    assert trials[dead.number].state == TrialState.FAIL
    assert trials[alive.number].state == TrialState.RUNNING
    (retry,) = [t for t in trials if t.state == TrialState.WAITING]
    assert retry.user_attrs["retry_of"] == dead.number
    assert study_mod.counts(again) == (1, 1)  # the re-queued trial is not finished
    nxt = again.ask()
    space.suggest(nxt, setup.params)
    assert nxt.params == dead.params  # and runs next, with the same parameters


def test_continuing_with_changed_settings_is_refused(tmp_path):
    study_mod.open_study(_build(_study(tmp_path)))
    study_mod.open_study(_build(_study(tmp_path, trials=50, parallel=4)))  # may change
    with pytest.raises(ConfigError) as err:
        study_mod.open_study(_build(_study(tmp_path, presets=["fedmim", "local_lr"])))
    assert err.value.key == "dir" and "space" in err.value.expected


def test_bundles_reserve_what_the_actors_ask_for():
    cfg = config_mod.load(TINY, ["runtime.num_actors=3", "runtime.cpus_per_actor=0.5",
                                 "runtime.gpus_per_actor=0.25"])
    assert bundles(cfg) == [{"CPU": 0.5, "GPU": 0.25}] * 3
    assert bundles(config_mod.load(TINY)) == [{"CPU": 1.0}] * 2


def test_shipped_studies_validate():
    folder = os.path.join(ROOT, "configs", "studies")
    names = sorted(os.listdir(folder))
    assert "adabest_fmnist.yaml" in names
    for name in names:
        setup = spec.load(os.path.join(folder, name))
        assert setup.spec.objective.metric == "val_accuracy"
        assert setup.base["data"]["validation_clients"] > 0


def test_readme_is_the_generated_reference():
    from tune.docs import HEADER, reference

    with open(os.path.join(ROOT, "tune", "README.md")) as f:
        assert f.read() == HEADER + reference(), "run: python -m tune --keys --write tune/README.md"


def test_cli_reports_a_bad_study_in_one_line(tmp_path, capsys):
    from rayfl.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(f"base: {TINY}\npresets: [nope]\nobjective: {{metric: test_loss}}\n")
    assert main(["tune", str(path)]) == 2
    err = capsys.readouterr().err
    assert "presets" in err and "'nope'" in err and "adabest" in err


def test_sqlalchemy_url_storage_continues(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    setup = _build(_study(tmp_path, storage=url))
    study = study_mod.open_study(setup)
    trial = study.ask()
    space.suggest(trial, setup.params)
    study.tell(trial, 0.25)
    again = study_mod.open_study(setup)
    assert [t.value for t in again.get_trials()] == [0.25]
    assert study_mod.storage_target(setup) == url


@pytest.mark.parametrize("name, active", [
    ("ima", lambda c: [w.name for w in c.wrappers] == ["ima"]),
    ("oort", lambda c: c.selection.name == "oort"),
    ("power_of_choice", lambda c: c.selection.name == "power_of_choice"),
    ("clip", lambda c: [t["name"] for t in c.aggregation.transforms] == ["clip"]),
    ("krum", lambda c: [t["name"] for t in c.aggregation.transforms] == ["krum"]),
    ("trimmed_mean", lambda c: [t["name"] for t in c.aggregation.transforms] == ["trimmed_mean"]),
])
def test_component_presets_search_their_keys_and_switch_the_component_on(tmp_path, name, active):
    """A wrapper's, selector's or robust rule's preset works on any base: every draw is a valid
    run config in which the component runs with the drawn values."""
    setup = _build(_study(tmp_path, overrides=[f"data.cache_dir={tmp_path / 'cache'}",
                                               "clients_per_round=10"], presets=[name]))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(20):
        values = space.suggest(study.ask(), setup.params)
        cfg = config_mod.from_dict(space.apply(setup.base, values))
        assert active(cfg)
        for key, value in values.items():
            assert config_mod.get_key(config_mod.to_dict(cfg), key) == pytest.approx(value)


def test_a_trial_whose_run_left_nothing_behind_keeps_no_run_dir(tmp_path):
    """A run stopped by bad input before its first round removes its directory: the trial
    does not point at it."""
    from tune import driver

    class StoppedInRoundOne:
        def done(self):
            return True

        def new_evals(self):
            return []

        def summary(self):
            raise RuntimeError("a transform broke its contract")

        def release(self):
            pass

    setup = _build(_study(tmp_path))
    study = optuna.create_study()
    trial = study.ask()
    trial.set_user_attr("run_dir", str(tmp_path / "study" / "trials" / "t0000"))
    info = driver._advance(setup, study, driver._Live(trial, StoppedInRoundOne(), {}))
    assert info["state"] == "FAIL" and "broke its contract" in info["reason"]
    assert study.trials[0].user_attrs["run_dir"] is None
