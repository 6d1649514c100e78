"""The study YAML: typed, validated sections (same schema machinery and errors as run configs).

:func:`load` reads a study file (plus dotted ``key=value`` overrides), resolves its base run
config and checks every searched key against the run-config schema before Ray starts, so a bad
study fails with one :class:`ConfigError` naming the key, the value and what was expected.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from rayfl import config as config_mod
from rayfl import schema
from rayfl.schema import ConfigError, field
from tune import space as space_mod


@dataclass(frozen=True)
class ObjectiveSpec:
    """What a trial is scored by (validation metrics by default: no test-set leakage)."""

    metric: str = field("val_accuracy", doc="metrics column scored at every evaluation: "
                                            "val_accuracy (held-out validation clients), "
                                            "val_loss, or test_* only as an explicit opt-in "
                                            "(tunes on the test set: leakage, warned)")
    direction: Optional[Literal["maximize", "minimize"]] = field(
        None, doc="whether a higher metric is better (default: minimize for *loss, else maximize)")
    reduce: Literal["last", "mean_last_k", "rounds_to_target"] = field(
        "last", doc="last evaluation; mean of the last k evaluations; or rounds until the metric "
                    "reaches target (minimised; rounds + 1 when never reached)")
    last_k: int = field(5, doc="k for reduce: mean_last_k", lo=1)
    target: Optional[float] = field(None, doc="target metric value for reduce: rounds_to_target")

    @property
    def metric_direction(self) -> str:
        """Whether a higher value of the metric itself is better."""
        return self.direction or ("minimize" if self.metric.endswith("loss") else "maximize")

    @property
    def study_direction(self) -> str:
        """Optuna's direction: the metric's, or minimize for rounds to target."""
        return "minimize" if self.reduce == "rounds_to_target" else self.metric_direction

    def value(self, evals: list[tuple[int, float]]) -> float:
        """The objective over the evaluations so far, given as (rounds run, metric) pairs.

        For rounds_to_target an unreached target scores one more round than run so far, which
        after the run's last evaluation is rounds + 1; so the same value serves for pruning
        (reported after every evaluation) and as the final objective.
        """
        metrics = [m for _, m in evals]
        if self.reduce == "last":
            return metrics[-1]
        if self.reduce == "mean_last_k":
            tail = metrics[-self.last_k:]
            return sum(tail) / len(tail)
        up = self.metric_direction == "maximize"
        reached = (n for n, m in evals if (m >= self.target if up else m <= self.target))
        return float(next(reached, evals[-1][0] + 1))

    def check(self, prefix: str) -> None:
        if self.reduce == "rounds_to_target" and self.target is None:
            raise ConfigError(f"{prefix}.target", None,
                              "a metric value to reach when objective.reduce is rounds_to_target")


@dataclass(frozen=True)
class SamplerSpec:
    """Optuna's sampler (seeded, so a study is reproducible in its choices)."""

    name: Literal["tpe", "random"] = field("tpe", doc="tpe (default) or random")
    seed: int = field(0, doc="sampler seed", lo=0)
    startup_trials: int = field(10, doc="tpe: random trials before TPE takes over", lo=0)
    multivariate: bool = field(False, doc="tpe: model the parameters jointly")
    constant_liar: bool = field(True, doc="tpe: treat running trials as bad so parallel trials "
                                          "spread out")


@dataclass(frozen=True)
class PrunerSpec:
    """When a trial is stopped early (steps are rounds run, reported at every evaluation)."""

    name: Literal["median", "hyperband", "none"] = field(
        "median", doc="median (MedianPruner), hyperband (HyperbandPruner) or none")
    startup_trials: int = field(5, doc="median: finished trials before anything is pruned",
                                lo=0)
    warmup_rounds: int = field(0, doc="median: no pruning before this many rounds", lo=0)
    min_rounds: int = field(1, doc="hyperband: rounds every trial gets (min_resource)", lo=1)
    reduction_factor: int = field(3, doc="hyperband: reduction factor η", lo=2)


@dataclass(frozen=True)
class StudySpec:
    """One Optuna study over rayfl runs."""

    base: Union[str, dict[str, Any]] = field(
        doc="the base run config: a path (relative to the study file) or an inline mapping")
    name: Optional[str] = field(None, doc="study name in the storage (default: the study "
                                          "file's stem)")
    dir: Optional[str] = field(None, doc="study directory for outputs and the journal "
                                         "(default: studies/<name>)")
    overrides: list[str] = field(factory=list, doc="dotted key=value overrides on the base "
                                                   "config (e.g. algorithm.name=adabest)")
    presets: list[str] = field(factory=list, doc="ready search spaces: "
                                                 + ", ".join(space_mod.PRESETS) + "; or the "
                                                 "base config's algorithm.name (e.g. "
                                                 "my_pkg.algo:MyAlgo) when its traits declare "
                                                 "a search_space")
    space: dict[str, Any] = field(
        factory=dict, doc="dotted config key → {type, low, high, log, step, choices, size} "
                          "(replaces a preset's entry for that key)")
    enqueue: list[dict[str, Any]] = field(
        factory=list, doc="trials to run first: mappings of searched keys to values (e.g. the "
                          "paper defaults)")
    objective: ObjectiveSpec = field(factory=ObjectiveSpec)
    trials: int = field(20, doc="trials to finish (complete, pruned or failed; interrupted "
                                "ones re-run)", lo=1)
    parallel: int = field(1, doc="trials run at once by this process, each in its own "
                                 "placement group", lo=1)
    sampler: SamplerSpec = field(factory=SamplerSpec)
    pruner: PrunerSpec = field(factory=PrunerSpec)
    storage: Optional[str] = field(None, doc="null: journal file <dir>/optuna.log; a path: "
                                             "journal file; a SQLAlchemy URL (sqlite:///…, "
                                             "postgresql://…): RDB storage")
    stale_after_s: float = field(120.0, doc="a running trial without a heartbeat for this long "
                                            "belongs to a dead process: it is failed and re-run",
                                 lo=30.0)


@dataclass(frozen=True)
class StudySetup:
    """A validated study: its spec, the base run config (as written, with the spec's overrides,
    and resolved with every default) and the search space."""

    spec: StudySpec
    name: str
    dir: str
    base_raw: dict
    base: dict
    params: dict[str, space_mod.Param]
    enqueued: list[dict]


def _base_raw(spec: StudySpec, study_path: str | None) -> dict:
    src = spec.base
    if isinstance(src, dict):
        return src
    if study_path and not os.path.isabs(src):
        src = os.path.join(os.path.dirname(os.path.abspath(study_path)), src)
    return config_mod.read_yaml(src)


def build(raw: dict, study_path: str | None = None) -> StudySetup:
    """Validate a plain study dict into a :class:`StudySetup` (all checks, no Ray)."""
    if not isinstance(raw, dict):
        raise ConfigError("<root>", raw, "a mapping of study keys")
    spec = schema.build(StudySpec, raw)
    base_raw = config_mod.apply_overrides(_base_raw(spec, study_path), spec.overrides)
    base = config_mod.to_dict(config_mod.from_dict(base_raw))
    name = spec.name or (os.path.splitext(os.path.basename(study_path))[0] if study_path
                         else "study")
    _check_objective(spec.objective, base)
    params = space_mod.resolve(spec.presets, spec.space, base)
    enqueued = [space_mod.internal_params(params, entry, f"enqueue[{i}]")
                for i, entry in enumerate(spec.enqueue)]
    study_dir = os.path.abspath(spec.dir or os.path.join("studies", name))  # trials run elsewhere
    return StudySetup(spec, name, study_dir, base_raw, base, params, enqueued)


def load(path: str, overrides: list[str] | None = None) -> StudySetup:
    """A :class:`StudySetup` from a study YAML file and dotted overrides of its keys."""
    raw = config_mod.apply_overrides(config_mod.read_yaml(path), overrides or [])
    return build(raw, path)


def _check_objective(obj: ObjectiveSpec, base: dict) -> None:
    if obj.metric.startswith("val_") and base["data"]["validation_clients"] == 0:
        raise ConfigError("objective.metric", obj.metric,
                          "a base config with held-out validation clients "
                          "(data.validation_clients > 0); or objective.metric: test_accuracy "
                          "as an explicit opt-in (that tunes on the test set)")
    if obj.metric.startswith("test_"):
        warnings.warn(f"objective.metric = {obj.metric!r} tunes on the test set: the best "
                      f"trial's test score is optimistic (leakage); use held-out validation "
                      f"clients (data.validation_clients, objective.metric: val_accuracy)",
                      UserWarning, stacklevel=2)
