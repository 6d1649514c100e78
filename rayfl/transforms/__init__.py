"""Aggregation transforms: layers every client upload, and then the round's sum, pass through.

A transform is a :class:`~rayfl.layers.Layer` in the ``aggregation.transforms`` section: it sees
each client's upload Δ_i inside the worker that trained it (its client half,
:meth:`Transform.client` or ``client_apply``), before it is summed, and the round's
:class:`Aggregate` at the server (its server half, ``aggregate``), before the algorithm's server
update. Client halves run in the order of the section and server halves in the reverse order (a
stack: the last encoder on the client is the first decoder at the server), so they compose with
every algorithm: this is where clipping, noise, quantisation, compression and
secure-aggregation arithmetic plug in. A transform is a :class:`Transform` subclass with a
``Params`` dataclass (its config keys), named like every component (:mod:`rayfl.registry`): a
built-in name, a ``package.module:Name`` reference or a name given to
:func:`rayfl.register_transform`; randomness comes from the streams of ``rayfl/rng.py``, so
results stay independent of placement.

Beyond Δ_i a client half may use (see :class:`~rayfl.layers.ClientContext`): values its server
half broadcasts with the model (an adaptive clip norm), a persistent client slot of its own in
the state store (error-feedback residuals: saved, spilled, checkpointed and resumed like
algorithm state) and a payload summed over the round's clients into its own sums (a clipped
count); its server slot (``init``) is checkpointed with the run. ``upload_bytes`` is what one
client would send for its update Δ_i (an algorithm's extra payload, e.g. SCAFFOLD's Δc_i, is not
counted); the stack composes it, it is reported as ``upload_bytes`` per round and times the
upload on the virtual clock.
"""

from __future__ import annotations

from rayfl import registry
from rayfl.contract import calling, name_of
from rayfl.layers import ClientContext, Facts, declaration_problem
from rayfl.schema import ConfigError, NoParams
from rayfl.transforms.base import ClipParams, ClipUpdate, Identity, Transform
from rayfl.transforms.compress import entry_of
from rayfl.transforms.dp import GaussianDP

__all__ = ["ClientContext", "ClipParams", "ClipUpdate", "Identity", "NoParams", "Transform",
           "class_of", "transforms_of"]


def class_of(name: str, where: str = "aggregation.transforms[]") -> type[Transform]:
    """The transform an entry's ``name`` names (a ConfigError on ``{where}.name`` otherwise:
    unknown, not importable, not a Transform subclass or not declared as a layer is)."""
    try:
        cls = registry.resolve("transform", name)
    except ConfigError as e:  # the entry's own key (aggregation.transforms[1].name)
        raise ConfigError(f"{where}.name", name, e.expected) from None
    problem = declaration_problem(cls) or registry.params_problem(cls)
    if problem:
        raise ConfigError(f"{where}.name", name, problem)
    return cls


def validate(entries: list[dict], key: str = "aggregation.transforms") -> list[dict]:
    """Check every ``{name: ..., <params>}`` entry (ConfigError naming the bad key)."""
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        _params(entry, where)
    return entries


def _params(entry: dict, where: str):
    """(class, validated params) of one ``{name: ..., <params>}`` entry at ``where``."""
    cls = class_of(entry.get("name"), where)
    values = {k: v for k, v in entry.items() if k != "name"}
    return cls, registry.built_params(cls, values, where, f"{where}.name", entry.get("name"))


def user_classes(cfg) -> list[type[Transform]]:
    """The configured transforms that are not built-ins (their modules travel to Ray workers;
    the pre-flight runs them on one client)."""
    return [class_of(e["name"]) for _, e in entries_of(cfg)
            if not registry.is_builtin("transform", e["name"])]


def entries_of(cfg) -> list[tuple[str, dict]]:
    """(where, entry) of every configured step: ``aggregation.transforms``, then the
    ``compression`` section's step."""
    out = [(f"aggregation.transforms[{i}]", e) for i, e in enumerate(cfg.aggregation.transforms)]
    comp = getattr(cfg, "compression", None)
    if comp is not None:
        out.append(("compression", entry_of(comp)))
    return out


def _configured(cfg):
    """(where, class, validated params) of every configured step."""
    for where, entry in entries_of(cfg):
        yield where, *_params(entry, where)


def check_run(cfg) -> None:
    """Every step's cross-section rules (e.g. SecAgg needs uniform weighting)."""
    for where, cls, params in _configured(cfg):
        with calling(name_of(cls, "check_config")):
            cls.check_config(params, cfg, where)


def check_data(cfg, handle) -> None:
    """Every step's rules on the partition (e.g. label flipping needs class labels)."""
    for where, cls, params in _configured(cfg):
        with calling(name_of(cls, "check_data")):
            cls.check_data(params, handle, where)


def transforms_of(cfg, facts: Facts | None = None) -> list[Transform]:
    """The configured transforms: ``aggregation.transforms``, the ``compression`` step and
    DP-FedAvg's mechanism when ``privacy`` is set (the stack puts SecAgg's transport last); one
    that fails while being built is named. ``facts`` default to the config's own (seed, rounds,
    clients a round, the clients that train)."""
    return [step for _, step in keyed_transforms(cfg, facts)]


def keyed_transforms(cfg, facts: Facts | None = None) -> list[tuple[str, Transform]]:
    """:func:`transforms_of`'s transforms, each with the config key it is configured at."""
    if facts is None:
        facts = Facts(cfg.seed, cfg.rounds, cfg.clients_per_round,
                      cfg.data.num_clients - cfg.data.validation_clients)
    steps: list[tuple[str, Transform]] = []
    for where, cls, params in _configured(cfg):
        with calling(name_of(cls, "__init__")):
            steps.append((where, cls(params, facts)))
    if cfg.privacy is not None:
        steps.append(("privacy", GaussianDP.of(cfg.privacy, facts)))
    return steps

