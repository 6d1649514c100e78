"""Search spaces: one parameter per dotted run-config key, and the presets the mission names.

A ``weights`` parameter (FedMIM's α_j, β_j) is sampled as a total in [low, high] and a
stick-breaking split (``w_1 = total·s_1``, ``w_2 = (total − w_1)·s_2``, …, the last takes the
rest), so Σw = total ≤ high by construction: with high < 1, Σα < 1 holds in every trial and
no draw is ever rejected. Every searched key is checked against the run-config schema at its
range's ends before anything runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Optional

from rayfl import config as config_mod
from rayfl import registry, schema
from rayfl.schema import ConfigError, field

# presets for any algorithm: name -> (None, {dotted key: parameter spec})
GENERIC: dict[str, tuple[Optional[str], dict[str, dict]]] = {
    "local_lr": (None, {"local.lr": {"low": 1e-3, "high": 0.5, "log": True}}),
    "server_lr": (None, {"algorithm.server_lr": {"low": 0.1, "high": 3.0, "log": True}}),
}


def search_space(cls) -> dict[str, dict] | None:
    """The preset a component declares in its traits (``traits.search_space``; None: none)."""
    space = getattr(getattr(cls, "traits", None), "search_space", None)
    return {k: dict(v) for k, v in space.items()} if space else None


def algorithm_preset(name: str) -> tuple[str, dict[str, dict]] | None:
    """The preset an algorithm declares, named by the algorithm."""
    space = search_space(registry.resolve("algorithm", name))
    return None if space is None else (name, space)


def component_preset(kind: str, name: str) -> tuple[None, dict[str, dict]] | None:
    """The preset a server wrapper, client selector or aggregation transform declares, for any
    algorithm: its keys name the component too (``wrappers.ima.window`` adds IMA,
    ``selection.name`` picks the selector, ``aggregation.transforms.krum.byzantine`` adds a
    Krum entry)."""
    space = search_space(registry.resolve(kind, name))
    return None if space is None else (None, space)


# name -> (algorithm it belongs to, or None for any; {dotted key: parameter spec}); a user
# algorithm's own preset is found by its name (package.module:Name) in :func:`preset`
PRESETS: dict[str, tuple[Optional[str], dict[str, dict]]] = {
    **{name: p for name in registry.names("algorithm")
       if (p := algorithm_preset(name)) is not None},
    **{name: p for kind in ("wrapper", "selector", "transform") for name in registry.names(kind)
       if (p := component_preset(kind, name)) is not None},
    **GENERIC,
}


def preset(name: str, base: dict) -> tuple[Optional[str], dict[str, dict]]:
    """A preset by name: built-in, or the base config's own algorithm's (its traits)."""
    if name in PRESETS:
        return PRESETS[name]
    algo = base["algorithm"]["name"]
    found = algorithm_preset(algo) if name == algo else None
    if found is None:
        raise ConfigError("presets", name, "one of " + ", ".join(PRESETS) + ", or the base "
                          "config's algorithm.name when its traits declare a search_space")
    return found


@dataclass(frozen=True)
class Param:
    """How one dotted run-config key is searched."""

    type: Literal["float", "int", "categorical", "weights"] = field(
        "float", doc="float, int, categorical, or weights (a list with Σ in [low, high])")
    low: Optional[float] = field(None, doc="lower end (weights: of the total Σw)")
    high: Optional[float] = field(None, doc="upper end (weights: of the total Σw)")
    log: bool = field(False, doc="float/int: sample on a log scale (low > 0)")
    step: Optional[float] = field(None, doc="float/int: grid step", lo=0.0, lo_open=True)
    choices: Optional[list[Any]] = field(None, doc="categorical: the values (scalars)")
    size: Optional[int] = field(None, doc="weights: number of weights J (default: the base "
                                          "config's list length)", lo=1)

    def check(self, prefix: str) -> None:
        if self.type == "categorical":
            if not self.choices or not all(isinstance(c, (str, int, float, bool)) or c is None
                                           for c in self.choices):
                raise ConfigError(f"{prefix}.choices", self.choices,
                                  "a non-empty list of scalars for type categorical")
            return
        for end in ("low", "high"):
            if getattr(self, end) is None:
                raise ConfigError(f"{prefix}.{end}", None, f"a number for type {self.type}")
        if not self.low < self.high:
            raise ConfigError(f"{prefix}.high", self.high, f"a value above low = {self.low:g}")
        if self.log and (self.type not in ("float", "int") or self.low <= 0 or self.step):
            raise ConfigError(f"{prefix}.log", self.log, "log only for float/int with low > 0 "
                                                         "and no step")
        if self.type == "int" and not all(float(v).is_integer() for v in
                                          (self.low, self.high, self.step or 1)):
            raise ConfigError(f"{prefix}.low", self.low, "integer low, high and step for type int")
        if self.type == "weights" and self.low < 0:
            raise ConfigError(f"{prefix}.low", self.low, "a total ≥ 0 for type weights")


def apply(base: dict, values: dict[str, Any]) -> dict:
    """A copy of the base config dict with every searched key set to its value."""
    raw = config_mod.apply_overrides(base, [])
    for key, value in values.items():
        config_mod.set_key(raw, key, value)
    return raw


def stick(total: float, splits: list[float]) -> list[float]:
    """Weights summing to ``total``: each split takes its share of what is left."""
    out, rest = [], total
    for s in splits:
        out.append(rest * s)
        rest = rest * (1.0 - s)
    return [*out, rest]


def resolve(presets: list[str], space: dict, base: dict) -> dict[str, Param]:
    """The validated parameters: presets first, then explicit ``space`` entries replace them."""
    specs: dict[str, Any] = {}
    for name in presets:
        algo, entries = preset(name, base)
        if algo is not None and base["algorithm"]["name"] != algo:
            raise ConfigError("presets", name, f"a base config with algorithm.name: {algo} "
                                               f"(it has {base['algorithm']['name']})")
        specs.update(entries)
    specs.update(space)
    if not specs:
        raise ConfigError("space", space, "at least one parameter to search (space or presets)")
    params = {}
    for key, spec in specs.items():
        param = schema.build(Param, spec, f"space.{key}")
        if param.type == "weights":
            current = config_mod.get_key(base, key)
            if param.size is None and not isinstance(current, list):
                raise ConfigError(f"space.{key}.size", None, "the number of weights (the base "
                                                            f"config has {key} = {current!r})")
            param = dataclasses.replace(param, size=param.size or len(current))
        params[key] = param
    _check_ends(params, base)
    return params


def _ends(p: Param) -> list[Any]:
    if p.type == "categorical":
        return list(p.choices)
    if p.type == "int":
        return [int(p.low), int(p.high)]
    if p.type == "weights":
        return [[t / p.size] * p.size for t in (p.low, p.high)]
    return [p.low, p.high]


def _error(base: dict, values: dict[str, Any]) -> ConfigError | None:
    try:
        config_mod.from_dict(apply(base, values))
    except ConfigError as e:
        return e
    return None


def _check_ends(params: dict[str, Param], base: dict) -> None:
    """Each parameter at each end of its range makes a valid run config, alone or with the other
    parameters at their low ends (for joint rules such as FedMIM's equal α/β lengths)."""
    lows = {k: _ends(p)[0] for k, p in params.items()}
    for key, p in params.items():
        for value in _ends(p):
            err = _error(base, {key: value})
            if err is not None and _error(base, {**lows, key: value}) is not None:
                raise ConfigError(f"space.{key}", value, f"values the run config accepts ({err})")


def suggest(trial, params: dict[str, Param]) -> dict[str, Any]:
    """Ask Optuna for every parameter; returns dotted key → run-config value."""
    for key, p in params.items():
        if p.type == "float":
            trial.suggest_float(key, p.low, p.high, log=p.log, step=p.step)
        elif p.type == "int":
            trial.suggest_int(key, int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        elif p.type == "categorical":
            trial.suggest_categorical(key, p.choices)
        else:
            trial.suggest_float(f"{key}.total", p.low, p.high)
            for j in range(1, p.size):
                trial.suggest_float(f"{key}.split{j}", 0.0, 1.0)
    return config_values(params, trial.params)


def config_values(params: dict[str, Param], optuna_params: dict[str, Any]) -> dict[str, Any]:
    """Run-config values from a trial's Optuna parameters (weights rebuilt from total/split)."""
    out = {}
    for key, p in params.items():
        if p.type == "weights":
            out[key] = stick(optuna_params[f"{key}.total"],
                             [optuna_params[f"{key}.split{j}"] for j in range(1, p.size)])
        else:
            out[key] = optuna_params[key]
    return out


def internal_params(params: dict[str, Param], entry: Any, where: str) -> dict[str, Any]:
    """Optuna parameters for an enqueued trial given as dotted key → run-config value."""
    if not isinstance(entry, dict):
        raise ConfigError(where, entry, "a mapping of searched keys to values")
    out: dict[str, Any] = {}
    for key, value in entry.items():
        p = params.get(key)
        if p is None:
            raise ConfigError(f"{where}.{key}", value, "a searched key (" + ", ".join(params)
                              + ")")
        if p.type == "categorical":
            if value not in p.choices:
                raise ConfigError(f"{where}.{key}", value, f"one of {p.choices}")
            out[key] = value
        elif p.type == "weights":
            out.update(_unstick(key, p, value, f"{where}.{key}"))
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    p.low <= value <= p.high):
                raise ConfigError(f"{where}.{key}", value,
                                  f"a number in [{p.low:g}, {p.high:g}] (the searched range)")
            out[key] = value
    return out


def _unstick(key: str, p: Param, value: Any, where: str) -> dict[str, float]:
    if (not isinstance(value, list) or len(value) != p.size
            or not all(isinstance(v, (int, float)) and v >= 0 for v in value)
            or not p.low <= sum(value) <= p.high):
        raise ConfigError(where, value, f"{p.size} weights ≥ 0 with a sum in "
                                        f"[{p.low:g}, {p.high:g}]")
    total = float(sum(value))
    out, rest = {f"{key}.total": total}, total
    for j in range(1, p.size):
        out[f"{key}.split{j}"] = min(1.0, value[j - 1] / rest) if rest > 0 else 0.0
        rest -= value[j - 1]
    return out

