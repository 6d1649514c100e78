"""The Optuna side: storage, sampler and pruner from the spec, trial accounting, and hand-back.

A study is continued by running the same command again: the storage keeps every trial, so
finished trials (complete, pruned, failed) are never re-run, while a trial whose process died
(no heartbeat for ``stale_after_s``) or was interrupted is failed and its parameters are enqueued
again as a new trial that carries ``retry_of``.
"""

from __future__ import annotations

import os
import time
import warnings

import optuna
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from rayfl.schema import ConfigError, to_dict
from tune.spec import StudySetup

JOURNAL = "optuna.log"  # the default journal file in the study directory
RECORD = "setup.yaml"  # what the study was started with; a continuation must match it


def storage_target(setup: StudySetup) -> str:
    """The storage as a user names it: a SQLAlchemy URL or a journal file path."""
    return setup.spec.storage or os.path.join(setup.dir, JOURNAL)


def _storage(target: str):
    if "://" in target:
        return target
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    return JournalStorage(JournalFileBackend(target))


def _sampler(setup: StudySetup, existing: int) -> optuna.samplers.BaseSampler:
    """Seeded with seed + trials already in the study, so a continuation draws anew."""
    s = setup.spec.sampler
    seed = s.seed + existing
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():  # multivariate and constant_liar are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=s.startup_trials,
                                          multivariate=s.multivariate,
                                          constant_liar=s.constant_liar)


def _pruner(setup: StudySetup) -> optuna.pruners.BasePruner:
    p = setup.spec.pruner
    if p.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials,
                                           n_warmup_steps=p.warmup_rounds)
    if p.name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=p.min_rounds,
                                              max_resource=setup.base["rounds"],
                                              reduction_factor=p.reduction_factor)
    return optuna.pruners.NopPruner()


def _record(setup: StudySetup) -> dict:
    s = setup.spec
    rec = {"name": setup.name, "base": setup.base_raw,  # as written: new rayfl keys don't count
           "space": {k: to_dict(p) for k, p in setup.params.items()},
           "objective": to_dict(s.objective), "sampler": to_dict(s.sampler),
           "pruner": to_dict(s.pruner)}
    return yaml.safe_load(yaml.safe_dump(rec))


def _check_record(setup: StudySetup) -> None:
    path = os.path.join(setup.dir, RECORD)
    rec = _record(setup)
    if os.path.isfile(path):
        with open(path) as f:
            old = yaml.safe_load(f)
        changed = [k for k in rec if rec[k] != old.get(k)]
        if changed:
            raise ConfigError("dir", setup.dir, f"a new study directory, or the settings the study "
                                                f"there was started with (changed: "
                                                f"{', '.join(changed)}; see {path})")
    os.makedirs(setup.dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        yaml.safe_dump(rec, f, sort_keys=False)
    os.replace(path + ".tmp", path)


def open_study(setup: StudySetup) -> optuna.Study:
    """Create the study, or load it to continue; a new study gets the spec's enqueued trials."""
    _check_record(setup)
    study = optuna.create_study(storage=_storage(storage_target(setup)),
                                study_name=setup.name, pruner=_pruner(setup),
                                direction=setup.spec.objective.study_direction,
                                load_if_exists=True)
    existing = len(study.get_trials(deepcopy=False))
    study.sampler = _sampler(setup, existing)
    if not existing:
        for params in setup.enqueued:
            study.enqueue_trial(params)
    return study


def counts(study: optuna.Study) -> tuple[int, int]:
    """(finished trials, running trials); an interrupted trial that was re-queued is neither."""
    trials = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("retry_of") for t in trials}
    done = sum(t.state in (TrialState.COMPLETE, TrialState.PRUNED)
               or (t.state == TrialState.FAIL and t.number not in retried) for t in trials)
    return done, sum(t.state == TrialState.RUNNING for t in trials)


def requeue(study: optuna.Study, number: int, params: dict, reason: str) -> None:
    """Fail a running trial and enqueue its parameters again (unless it finished meanwhile)."""
    try:
        study.tell(number, state=TrialState.FAIL)
    except (ValueError, RuntimeError):
        return  # another process finished or re-queued it first
    study.enqueue_trial(params, user_attrs={"retry_of": number, "retry_reason": reason})


def fail_stale(study: optuna.Study, own: set[int], stale_after_s: float) -> None:
    """Re-queue running trials of other processes that stopped sending heartbeats."""
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = t.user_attrs.get("heartbeat", t.datetime_start.timestamp())
        if t.number not in own and now - beat > stale_after_s:
            requeue(study, t.number, t.params, f"no heartbeat for {now - beat:.0f} s")
