"""The study directory's outputs: ``trials.parquet``, ``best.yaml`` (a config ``rayfl run``
accepts), ``summary.json`` and PNG plots (optimisation history, parameter importances, and the
objective over the two most important parameters)."""

from __future__ import annotations

import json
import os
import warnings

import optuna
import yaml
from optuna.trial import FrozenTrial, TrialState

from rayfl import config as config_mod
from rayfl.metrics.files import write_json, write_parquet
from tune import space
from tune.spec import StudySetup
from tune.study import storage_target


def write(setup: StudySetup, study: optuna.Study, wall_s: float) -> dict:
    """Write every output of the study as it stands; returns the summary."""
    trials = study.get_trials(deepcopy=False)
    write_parquet([_row(t) for t in trials], os.path.join(setup.dir, "trials.parquet"))
    states = [t.state.name for t in trials]
    obj = setup.spec.objective
    summary = {"name": setup.name, "storage": storage_target(setup),
               "dashboard": f"optuna-dashboard {storage_target(setup)}",
               "objective": {"metric": obj.metric, "reduce": obj.reduce,
                             "direction": obj.study_direction},
               "trials": {s: states.count(s) for s in sorted(set(states))},
               "wall_time_s": wall_s, "best": None, "plots": {}}
    if any(t.state == TrialState.COMPLETE for t in trials):
        summary["best"] = _write_best(setup, study.best_trial)
        summary["plots"] = plots(study, setup.dir, f"{obj.metric} ({obj.reduce})")
    write_json(summary, os.path.join(setup.dir, "summary.json"))
    return summary


def _row(t: FrozenTrial) -> dict:
    attrs = t.user_attrs
    # only a complete trial has an objective value; a pruned one's last report stands apart,
    # so sorting ``value`` never ranks a pruned trial above the best complete one
    last = t.intermediate_values[t.last_step] if t.last_step is not None else None
    return {"number": t.number, "state": t.state.name,
            "value": t.value if t.state == TrialState.COMPLETE else None,
            "last_reported_value": last,
            "rounds_run": t.last_step, "duration_s": t.duration.total_seconds()
            if t.duration else None,
            "started": t.datetime_start.isoformat() if t.datetime_start else None,
            "test_accuracy": attrs.get("test_accuracy"), "reason": attrs.get("reason"),
            "retry_of": attrs.get("retry_of"), "run_dir": attrs.get("run_dir"),
            **attrs.get("values", {})}


def _write_best(setup: StudySetup, best: FrozenTrial) -> dict:
    values = space.config_values(setup.params, best.params)
    raw = space.apply(setup.base, values)
    raw["name"] = f"{setup.name}-best"
    cfg = config_mod.from_dict(raw)
    path = os.path.join(setup.dir, "best.yaml")
    obj = setup.spec.objective
    with open(path + ".tmp", "w") as f:
        f.write(f"# Best trial {best.number} of study {setup.name}: {obj.metric} ({obj.reduce}) "
                f"= {best.value:.6g}\n# rayfl run {path}\n")
        yaml.safe_dump(config_mod.to_dict(cfg), f, sort_keys=False)
    os.replace(path + ".tmp", path)
    out = {"number": best.number, "value": best.value, "values": values,
           "test_accuracy": best.user_attrs.get("test_accuracy")}
    run_summary = os.path.join(best.user_attrs.get("run_dir", ""), "summary.json")
    if os.path.isfile(run_summary):  # the run's own mean of its last eval.last_k test accuracies
        with open(run_summary) as f:
            out.update({f"test_{k}": v for k, v in json.load(f).items()
                        if k.startswith("mean_last_")})
    return {**out, "run_dir": best.user_attrs.get("run_dir"), "config": path}


def plots(study: optuna.Study, out_dir: str, target: str = "objective") -> dict[str, str]:
    """Plot name → file; importances need two complete trials, the contour two parameters.
    ``target`` names the objective on the axes (Optuna's default is "Objective Value")."""
    import matplotlib.pyplot as plt  # the process's own backend: Agg when headless; a
    # notebook keeps its inline one (each figure is closed once saved, so none is shown)
    from optuna.visualization import matplotlib as vis

    def save(ax, name: str) -> str:
        fig = ax.figure
        fig.savefig(os.path.join(out_dir, name), dpi=120, bbox_inches="tight")
        plt.close(fig)
        return name

    out = {}
    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the matplotlib backend is marked experimental
        out["history"] = save(vis.plot_optimization_history(study, target_name=target),
                              "history.png")
        ranked = list(optuna.importance.get_param_importances(study)) if complete >= 2 else []
        if ranked:
            out["importances"] = save(vis.plot_param_importances(study, target_name=target),
                                      "importances.png")
        if len(ranked) >= 2:
            out["contour"] = save(vis.plot_contour(study, params=ranked[:2], target_name=target),
                                  "contour.png")
    return out
