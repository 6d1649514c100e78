"""Aggregation transforms: layers every client upload, and then the round's sum, pass through.

A transform is a :class:`~rayfl.layers.Layer` in the run's ``layers`` list (the older spelling:
``aggregation.transforms``; :mod:`rayfl.layer_list`): it sees each client's upload Δ_i inside
the worker that trained it (its client half, :meth:`~rayfl.layers.Layer.client` or
``client_apply``), before it is summed, and the round's :class:`Aggregate` at the server (its server half,
``aggregate``), before the algorithm's server update. Client halves run in the order of the
list and server halves in the reverse order (a
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
from rayfl.layers import ClientContext, declaration_problem
from rayfl.schema import ConfigError, NoParams
from rayfl.transforms.base import ClipParams, ClipUpdate, Identity, Transform

__all__ = ["ClientContext", "ClipParams", "ClipUpdate", "Identity", "NoParams", "Transform",
           "class_of"]


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
        entry_params(entry, f"{key}[{i}]")
    return entries


def entry_params(entry: dict, where: str):
    """(class, validated params) of one ``{name: ..., <params>}`` entry at ``where``."""
    cls = class_of(entry.get("name"), where)
    values = {k: v for k, v in entry.items() if k != "name"}
    return cls, registry.built_params(cls, values, where, f"{where}.name", entry.get("name"))
