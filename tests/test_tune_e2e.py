"""A small study on Ray end to end: parallel trials in placement groups, pruning, Σα < 1,
interruption and continuation without re-running finished trials, and a runnable best config."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
from optuna.trial import TrialState

from rayfl import config as config_mod
from tests.conftest import TINY
from tune import spec, study as study_mod
from tune.driver import run_study


class _Interrupt:
    """Progress callback that presses Ctrl-C when a given trial starts."""

    def __init__(self, number: int):
        self.number, self.events = number, []

    def __call__(self, kind: str, info: dict) -> None:
        self.events.append((kind, info))
        if kind == "start" and info["number"] == self.number:
            raise KeyboardInterrupt


def test_small_study_prunes_resumes_and_yields_a_runnable_best_config(ray_local, tmp_path):
    raw = {
        "name": "tiny", "base": TINY, "dir": str(tmp_path / "study"),
        "overrides": ["algorithm.name=fedmim", "rounds=3", "local.epochs=3",
                      "runtime.num_actors=1", "data.validation_clients=4",
                      f"data.cache_dir={tmp_path / 'cache'}",
                      f"output_dir={tmp_path / 'runs'}"],
        "presets": ["fedmim"], "space": {"local.lr": {"low": 1e-4, "high": 0.5, "log": True}},
        # two good trials first (3 epochs: clearly above the initial model from round 0 on);
        # the third barely moves the model, so the median prunes it whichever good one finished
        "enqueue": [{"local.lr": 0.2}, {"local.lr": 0.1}, {"local.lr": 1e-4}],
        "trials": 3, "parallel": 2, "pruner": {"startup_trials": 1},
    }
    setup = spec.build(raw)  # objective: val_accuracy on the 4 validation clients

    with pytest.raises(KeyboardInterrupt):
        run_study(setup, _Interrupt(2))
    study = study_mod.open_study(setup)
    before = {t.number: t for t in study.get_trials()
              if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
    assert before, "a trial finished before the interruption"
    assert study.get_trials()[2].state == TrialState.FAIL  # interrupted, handed back

    summary = run_study(setup)  # the same call continues the study
    trials = study_mod.open_study(setup).get_trials()
    assert study_mod.counts(study_mod.open_study(setup)) == (3, 0)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for number, t in before.items():  # finished trials were not re-run
        assert number not in retried
        assert trials[number].datetime_complete == t.datetime_complete
    assert 2 in retried

    t0, t1 = trials[0], trials[1]  # launched together, ran at once
    assert t1.datetime_start < t0.datetime_complete and t0.datetime_start < t1.datetime_complete
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert pruned and all(t.user_attrs["reason"].startswith("pruned after round") for t in pruned)
    assert any(t.params["local.lr"] == 1e-4 for t in pruned)

    for t in trials:  # Σα < 1 in every FedMIM trial, as sampled and as run
        alpha = t.user_attrs["values"]["algorithm.alpha"]
        assert len(alpha) == 2 and min(alpha) >= 0 and sum(alpha) < 1
        path = os.path.join(t.user_attrs["run_dir"], "config.yaml")
        if os.path.isfile(path):
            assert sum(config_mod.load(path).algorithm.params.alpha) < 1

    import ray

    ours = [pg for pg in ray.util.placement_group_table().values()
            if pg["name"].startswith("tiny-t")]
    assert ours and all(pg["state"] == "REMOVED" for pg in ours)  # one group per trial, freed

    table = pq.read_table(os.path.join(setup.dir, "trials.parquet")).to_pylist()
    assert len(table) == len(trials)
    for row in table:  # a pruned trial's last report is no objective value: it cannot rank
        assert (row["value"] is None) == (row["state"] != "COMPLETE"), row
        if row["state"] == "PRUNED":
            assert row["last_reported_value"] is not None
    assert summary["objective"]["metric"] == "val_accuracy"
    assert summary["best"]["test_accuracy"] is not None  # reported apart from the objective
    assert summary["trials"]["COMPLETE"] >= 1 and summary["trials"]["PRUNED"] >= 1
    for name in ("history.png", "best.yaml", "summary.json", "setup.yaml", "optuna.log"):
        assert os.path.isfile(os.path.join(setup.dir, name)), name

    from rayfl.cli import main

    best = os.path.join(setup.dir, "best.yaml")
    assert main(["run", best, "--quiet", f"output_dir={tmp_path / 'best'}"]) == 0
