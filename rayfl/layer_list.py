"""The run's layers in the order its config gives them, innermost first.

One ``layers:`` list holds server wrappers and aggregation transforms alike, in the order
written: ``layers: [{name: ima, window: 5}, {name: clip, max_norm: 1.0}]`` is IMA around the
algorithm and clipping around both (client halves run in that order, server halves in the
reverse). ``wrappers:`` and ``aggregation.transforms:`` are its older spelling: a config that
writes them means the wrappers first, then the transforms, exactly as ``layers: [*wrappers,
*aggregation.transforms]``; the two spellings are not mixed in one config. The ``compression``
section is one more transform after them and ``privacy`` the outermost layer (its mechanism);
the stack puts a transport layer (SecAgg) last.

Every reader of the run's layers goes through :func:`entries_of` (``cfg.layer_entries()``): the
rule table, the pre-flight, the stack's builder, the Ray workers' modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayfl import registry
from rayfl.contract import calling, name_of
from rayfl.layers import Facts, Layer, declaration_problem
from rayfl.schema import ConfigError
from rayfl.transforms import entry_params
from rayfl.transforms.compress import entry_of
from rayfl.transforms.dp import GaussianDP

#: the name of the ``layers`` entry that is the ``privacy`` section
PRIVACY = "privacy"
#: the config keys of the older spelling, and what it became
OLDER = ("wrappers", "aggregation.transforms")
BECAME = ("`layers` holds the wrappers and the transforms in one list, innermost first: "
          "wrappers: [A] with aggregation.transforms: [B] is layers: [A, B]")


@dataclass(frozen=True)
class Entry:
    """One configured layer: where the config gives it, its kind, name, class and keys."""

    where: str  # layers[2], wrappers[0], aggregation.transforms[1], compression
    kind: str  # "wrapper" or "transform"
    name: str
    cls: type
    params: Any

    @property
    def builtin(self) -> bool:
        return registry.is_builtin(self.kind, self.name)


def privacy_preset(raw: dict) -> tuple[dict, str | None]:
    """A plain config with its ``layers`` entry ``{name: privacy, <keys>}`` moved to the
    ``privacy`` section it is, and that entry's key (None when it has none). The mechanism is
    the outermost layer, so the entry is written last; one privacy section at most."""
    layers = raw.get("layers")
    if not isinstance(layers, list):
        return raw, None
    at = [i for i, e in enumerate(layers) if isinstance(e, dict) and e.get("name") == PRIVACY]
    if not at:
        return raw, None
    where = f"layers[{at[0]}]"
    if at != [len(layers) - 1]:
        raise ConfigError(f"{where}.name", PRIVACY, "the last entry (the privacy mechanism is "
                          "the outermost layer: its clipping sees every other client half's "
                          "upload, its noise is on the sum before any other server half)")
    if raw.get("privacy") is not None:
        raise ConfigError(f"{where}.name", PRIVACY, "one privacy mechanism (the privacy "
                          "section is given too; this entry is that section written as the "
                          "last layer)")
    section = {k: v for k, v in layers[-1].items() if k != "name"}
    return {**raw, "layers": layers[:-1], "privacy": section}, where


def entries_of(layers: list[dict], wrappers: list, transforms: list[dict],
               compression: Any) -> list[Entry]:
    """Every configured layer, innermost first: ``layers`` (or ``wrappers`` then
    ``aggregation.transforms``), then the ``compression`` section's step (a ConfigError naming
    the entry's key when it is unknown, not a layer or its keys are wrong); a config's own are
    ``cfg.layer_entries()``."""
    if layers:
        out = [_layer(f"layers[{i}]", e) for i, e in enumerate(layers)]
    else:
        out = [Entry(f"wrappers[{i}]", "wrapper", e.name, e.component(), e.params)
               for i, e in enumerate(wrappers)]
        out += [_transform(f"aggregation.transforms[{i}]", e) for i, e in enumerate(transforms)]
    if compression is not None:
        out.append(_transform("compression", entry_of(compression)))
    return out


def _layer(where: str, entry: dict) -> Entry:
    name = entry.get("name")
    kind, cls = registry.resolve_layer(name, f"{where}.name")
    problem = declaration_problem(cls) or registry.params_problem(cls)
    if problem:
        raise ConfigError(f"{where}.name", name, problem)
    values = {k: v for k, v in entry.items() if k != "name"}
    return Entry(where, kind, name, cls,
                 registry.built_params(cls, values, where, f"{where}.name", name))


def _transform(where: str, entry: dict) -> Entry:
    cls, params = entry_params(entry, where)
    return Entry(where, "transform", entry["name"], cls, params)


def wrappers(cfg) -> list[Entry]:
    """The configured server wrappers, innermost first."""
    return [e for e in cfg.layer_entries() if e.kind == "wrapper"]


def user_classes(cfg) -> list[type]:
    """The configured layers that are not built-ins (their modules travel to Ray workers; the
    pre-flight runs them on one client)."""
    return [e.cls for e in cfg.layer_entries() if not e.builtin]


def check_run(cfg) -> None:
    """Every wrapper declares itself as a layer does; each layer's own rules on the config hold
    (ComponentError naming its ``check_config`` when that raises); what its traits refuse, and
    the two spellings mixed, are :mod:`rayfl.compat`'s."""
    for e in cfg.layer_entries():
        if e.kind == "wrapper":
            problem = declaration_problem(e.cls)  # a ServerWrapper subclass: the registry's
            if problem:
                raise ConfigError(f"{e.where}.name", e.name, problem)
        with calling(name_of(e.cls, "check_config")):
            e.cls.check_config(e.params, cfg, e.where)


def check_data(cfg, handle) -> None:
    """Every layer's rules on the partition (e.g. label flipping needs class labels)."""
    for e in cfg.layer_entries():
        with calling(name_of(e.cls, "check_data")):
            e.cls.check_data(e.params, handle, e.where)


def built(cfg, facts: Facts) -> list[tuple[str, str, Layer]]:
    """(where, kind, layer) of every configured layer, innermost first, DP-FedAvg's mechanism
    outermost when ``privacy`` is set; one that fails while being built is named."""
    out = []
    for e in cfg.layer_entries():
        with calling(name_of(e.cls, "__init__")):
            out.append((e.where, e.kind, e.cls(e.params, facts)))
    if cfg.privacy is not None:
        out.append(("privacy", "transform", GaussianDP.of(cfg.privacy, facts)))
    return out


def transforms_of(cfg, facts: Facts | None = None) -> list[Layer]:
    """The configured aggregation transforms, built: the ``layers`` that are transforms (or
    ``aggregation.transforms``), the ``compression`` step and DP-FedAvg's mechanism when
    ``privacy`` is set. ``facts`` default to the config's own (seed, rounds, clients a round,
    the clients that train)."""
    if facts is None:
        facts = Facts(cfg.seed, cfg.rounds, cfg.clients_per_round,
                      cfg.data.num_clients - cfg.data.validation_clients)
    return [layer for _, kind, layer in built(cfg, facts) if kind == "transform"]
