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


def _raw(tmp_path, name: str, **spec) -> dict:
    return {
        "name": name, "base": TINY, "dir": str(tmp_path / name),
        "overrides": ["algorithm.name=fedmim", "rounds=3", "local.epochs=3",
                      "runtime.num_actors=1", "data.validation_clients=4",
                      f"data.cache_dir={tmp_path / 'cache'}",
                      f"output_dir={tmp_path / 'runs'}"],
        "presets": ["fedmim"], "space": {"local.lr": {"low": 1e-4, "high": 0.5, "log": True}},
        **spec,
    }


def test_parallel_trials_run_at_once_in_their_own_placement_groups(ray_local, tmp_path):
    """Two trials at once; no pruner, so nothing here depends on which one finishes first."""
    setup = spec.build(_raw(tmp_path, "par", enqueue=[{"local.lr": 0.2}, {"local.lr": 0.1}],
                            trials=2, parallel=2, pruner={"name": "none"}))
    summary = run_study(setup)
    trials = study_mod.open_study(setup).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    t0, t1 = trials  # both asked before either is told: they overlap by construction
    assert t1.datetime_start < t0.datetime_complete and t0.datetime_start < t1.datetime_complete
    for t in trials:  # Σα < 1 in every FedMIM trial, as sampled and as run
        alpha = t.user_attrs["values"]["algorithm.alpha"]
        assert len(alpha) == 2 and min(alpha) >= 0 and sum(alpha) < 1
        assert sum(config_mod.load(os.path.join(t.user_attrs["run_dir"], "config.yaml"))
                   .algorithm.params.alpha) < 1

    import ray

    ours = [pg for pg in ray.util.placement_group_table().values()
            if pg["name"].startswith("par-t")]
    assert len(ours) == 2 and all(pg["state"] == "REMOVED" for pg in ours)  # one each, freed
    assert summary["trials"]["COMPLETE"] == 2


def test_small_study_prunes_resumes_and_yields_a_runnable_best_config(ray_local, tmp_path):
    """One trial at a time, so the pruner always sees the same finished trials: the outcome is
    fixed by the seeds, not by which run finishes first or how fast the study reads them."""
    raw = _raw(
        tmp_path, "tiny",
        # two good trials first (3 epochs: clearly above the initial model from round 0 on);
        # the third barely moves the model, below the median of both finished ones
        enqueue=[{"local.lr": 0.2}, {"local.lr": 0.1}, {"local.lr": 1e-4}],
        trials=3, parallel=1, pruner={"startup_trials": 2})
    raw["overrides"].append("runtime.executor=inprocess")  # client actors: the test above
    setup = spec.build(raw)
    # objective: val_accuracy on the 4 validation clients

    with pytest.raises(KeyboardInterrupt):
        run_study(setup, _Interrupt(2))
    study = study_mod.open_study(setup)
    before = {t.number: t for t in study.get_trials()
              if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
    assert sorted(before) == [0, 1]
    assert all(t.state == TrialState.COMPLETE for t in before.values())  # startup trials
    assert study.get_trials()[2].state == TrialState.FAIL  # interrupted, handed back

    summary = run_study(setup)  # the same call continues the study
    trials = study_mod.open_study(setup).get_trials()
    assert study_mod.counts(study_mod.open_study(setup)) == (3, 0)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    for number, t in before.items():  # finished trials were not re-run
        assert number not in retried
        assert trials[number].datetime_complete == t.datetime_complete
    assert [t.user_attrs.get("retry_of") for t in trials] == [None, None, None, 2]
    retry = trials[3]
    assert retry.params["local.lr"] == 1e-4 and retry.state == TrialState.PRUNED
    assert retry.user_attrs["reason"].startswith("pruned after round")

    table = pq.read_table(os.path.join(setup.dir, "trials.parquet")).to_pylist()
    assert len(table) == len(trials)
    for row in table:  # a pruned trial's last report is no objective value: it cannot rank
        assert (row["value"] is None) == (row["state"] != "COMPLETE"), row
        if row["state"] == "PRUNED":
            assert row["last_reported_value"] is not None
    assert summary["objective"]["metric"] == "val_accuracy"
    assert summary["best"]["test_accuracy"] is not None  # reported apart from the objective
    assert summary["trials"]["COMPLETE"] == 2 and summary["trials"]["PRUNED"] == 1
    for name in ("history.png", "best.yaml", "summary.json", "setup.yaml", "optuna.log"):
        assert os.path.isfile(os.path.join(setup.dir, name)), name

    from rayfl.cli import main

    best = os.path.join(setup.dir, "best.yaml")
    assert main(["run", best, "--quiet", f"output_dir={tmp_path / 'best'}"]) == 0


def test_a_study_over_an_algorithm_registered_in_this_process_runs_its_trials(ray_local,
                                                                                tmp_path):
    """The trials run on Ray workers, which never saw the registration: the validated config
    they receive carries the component."""
    import rayfl
    from rayfl.algorithms.fedavg import FedAvg

    class RegisteredHere(FedAvg):
        """FedAvg under a name only this process knows."""

    rayfl.register_algorithm(RegisteredHere, name="registered_here")
    raw = _raw(tmp_path, "reg", enqueue=[{"local.lr": 0.1}], trials=1, parallel=1,
               pruner={"name": "none"}, presets=[])
    raw["overrides"] = [o for o in raw["overrides"] if not o.startswith("algorithm.name")] + \
        ["algorithm.name=registered_here"]
    summary = run_study(spec.build(raw))
    assert summary["trials"]["COMPLETE"] == 1
