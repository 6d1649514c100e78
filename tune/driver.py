"""The study loop: launch up to ``parallel`` trials, report each evaluation to Optuna, prune,
finish trials, and hand interrupted ones back to the queue; :func:`run_study` is the entry point.

This process alone talks to the storage (the trials are plain ``rayfl.run`` calls on Ray), so
any storage works without the workers reaching it. A diverged trial (NaN/inf metric, or the run's
own divergence stop) ends as pruned with its reason in the ``reason`` user attribute; it never
becomes a best value.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
import ray
from optuna.trial import TrialState

from rayfl import config as config_mod
from rayfl.data import prepare
from rayfl.runtime.cluster import connect_ray
from rayfl.schema import ConfigError
from tune import report, space
from tune import study as study_mod
from tune.spec import StudySetup
from tune.trial import TrialRun, fits

HEARTBEAT_S = 10.0  # how often running trials are marked alive in the storage
POLL_S = 1.0  # how often the trials' metrics are read

Event = Callable[[str, dict], None]


@dataclass
class _Live:
    """A trial this process runs (``run`` is None when its config was invalid)."""

    trial: optuna.Trial
    run: TrialRun | None
    values: dict[str, Any]
    rounds: int = 0
    error: str | None = None
    evals: list[tuple[int, float]] = field(default_factory=list)


def run_study(setup: StudySetup, on_event: Event | None = None) -> dict:
    """Run (or continue) the study until ``trials`` trials have finished; write its outputs."""
    emit = on_event or (lambda kind, info: None)
    cfg = config_mod.from_dict(setup.base)
    study = study_mod.open_study(setup)  # refuses changed settings before Ray starts
    prepare(cfg.data, cfg.seed)  # once, rather than by every trial at the same time
    started = connect_ray(cfg)
    try:
        _check_room(cfg, setup.spec.parallel, emit)
        emit("begin", {"name": setup.name, "finished": study_mod.counts(study)[0],
                       "trials": setup.spec.trials, "storage": study_mod.storage_target(setup)})
        tick = time.perf_counter()
        _optimize(setup, study, emit)
        return report.write(setup, study, time.perf_counter() - tick)
    finally:
        if started:
            ray.shutdown()


def _check_room(cfg, parallel: int, emit: Event) -> None:
    room = fits(cfg)
    if room < 1:
        have = ray.cluster_resources()
        raise ConfigError("runtime.num_actors", cfg.runtime.num_actors,
                          f"a trial that fits the cluster: num_actors × cpus_per_actor / "
                          f"gpus_per_actor within its {have.get('CPU', 0):g} CPUs and "
                          f"{have.get('GPU', 0):g} GPUs")
    if room < parallel:
        emit("note", {"text": f"parallel = {parallel} but the cluster holds {room} trial(s) at "
                              f"once; the others wait for resources"})


def _optimize(setup: StudySetup, study: optuna.Study, emit: Event) -> None:
    spec = setup.spec
    live: dict[int, _Live] = {}
    beat = 0.0
    try:
        while True:
            if time.time() - beat >= HEARTBEAT_S:
                beat = time.time()
                for lv in live.values():
                    lv.trial.set_user_attr("heartbeat", beat)
                study_mod.fail_stale(study, set(live), spec.stale_after_s)
            while len(live) < spec.parallel and sum(study_mod.counts(study)) < spec.trials:
                lv = _launch(setup, study)
                live[lv.trial.number] = lv
                emit("start", {"number": lv.trial.number, "values": lv.values})
            if not live:
                if not study_mod.counts(study)[1]:
                    return
                time.sleep(POLL_S)  # other processes' trials may still be handed back
                continue
            refs = [lv.run.ref for lv in live.values() if lv.run is not None]
            if refs:
                ray.wait(refs, num_returns=len(refs), timeout=POLL_S)
            for number in list(live):
                info = _advance(setup, study, live[number])
                if info is not None:
                    del live[number]
                    emit("end", info)
    except BaseException:
        for lv in live.values():
            _hand_back(study, lv)
        raise


def _hand_back(study: optuna.Study, lv: _Live) -> None:
    if lv.run is not None:
        lv.run.stop()
    lv.trial.set_user_attr("reason", "interrupted; re-queued")
    study_mod.requeue(study, lv.trial.number, lv.trial.params, "interrupted")


def _launch(setup: StudySetup, study: optuna.Study) -> _Live:
    trial = study.ask()
    lv = _Live(trial, None, {})
    try:
        lv.values = space.suggest(trial, setup.params)
        tag = f"{setup.name}-t{trial.number:04d}"
        run_dir = os.path.join(setup.dir, "trials", tag)
        trial.set_user_attr("values", lv.values)
        trial.set_user_attr("run_dir", run_dir)
        trial.set_user_attr("heartbeat", time.time())
        raw = space.apply(setup.base, lv.values)
        raw["name"] = tag
        lv.rounds = raw["rounds"]
        try:
            cfg = config_mod.from_dict(raw)
        except ConfigError as e:
            lv.error = f"invalid config: {e}"
            return lv
        lv.run = TrialRun(cfg, run_dir, tag)
        return lv
    except BaseException:
        _hand_back(study, lv)
        raise


def _advance(setup: StudySetup, study: optuna.Study, lv: _Live) -> dict | None:
    """Report the trial's new evaluations; once it has ended, tell Optuna and return its info."""
    obj, trial = setup.spec.objective, lv.trial
    if lv.run is None:
        return _finish(study, trial, TrialState.FAIL, reason=lv.error)
    ended = lv.run.done()
    for row in lv.run.new_evals():
        n, m = row["round"], row.get(obj.metric)  # rounds count from 1 in metrics.parquet
        if m is None:  # every trial would miss it: stop the study (the handler re-queues)
            logged = ", ".join(k for k, v in row.items() if v is not None)
            raise ConfigError("objective.metric", obj.metric,
                              f"a column the runs log at every evaluation (they log: {logged})")
        trial.set_user_attr("test_accuracy", row.get("test_accuracy"))
        if not math.isfinite(m):
            lv.run.stop()
            return _finish(study, trial, TrialState.PRUNED,
                           reason=f"diverged: {obj.metric} = {m} after round {n}")
        lv.evals.append((n, m))
        trial.report(obj.value(lv.evals), n)
        # whether the run already ended when its rows were read plays no part: the decision
        # depends on the reported values alone (the last round completes)
        if n < lv.rounds and trial.should_prune():
            lv.run.stop()
            return _finish(study, trial, TrialState.PRUNED,
                           reason=f"pruned after round {n} ({obj.metric} = {m:.4g})")
    if not ended:
        return None
    try:
        summary = lv.run.summary()
    except Exception as e:  # the run raised: the trial failed, the study goes on
        cause = getattr(e, "cause", None) or e
        if not os.path.isdir(trial.user_attrs["run_dir"]):  # stopped before its first round
            trial.set_user_attr("run_dir", None)  # by bad input: it left nothing behind
        return _finish(study, trial, TrialState.FAIL,
                       reason=f"run failed: {type(cause).__name__}: {str(cause)[-500:]}")
    finally:
        lv.run.release()
    if summary.get("diverged_at_round") is not None:
        return _finish(study, trial, TrialState.PRUNED,
                       reason=f"diverged in round {summary['diverged_at_round']} "
                              f"({summary.get('diverged_reason', 'NaN/inf')})")
    if not lv.evals:
        return _finish(study, trial, TrialState.FAIL, reason="no evaluation logged")
    return _finish(study, trial, TrialState.COMPLETE, value=obj.value(lv.evals))


def _finish(study: optuna.Study, trial: optuna.Trial, state: TrialState,
            value: float | None = None, reason: str | None = None) -> dict:
    if reason:
        trial.set_user_attr("reason", reason)
    study.tell(trial, value, state=state)
    return {"number": trial.number, "state": state.name, "value": value, "reason": reason,
            "test_accuracy": trial.user_attrs.get("test_accuracy")}
