"""Aggregation transforms: layers every client upload, and then the round's sum, pass through.

A transform is a :class:`~rayfl.layers.Layer` in the ``aggregation.transforms`` section: it sees
each client's upload Δ_i inside the worker that trained it (its client half,
:meth:`Transform.client` or ``client_apply``), before it is summed, and the round's
:class:`Aggregate` at the server (its server half, ``aggregate``), before the algorithm's server
update. Client halves run in the order of the section and server halves in the reverse order (a
stack: the last encoder on the client is the first decoder at the server), so they compose with
every algorithm: this is where clipping, noise, quantisation, compression and
secure-aggregation arithmetic plug in. A transform is a class with a ``Params`` dataclass (its
config keys) registered in :data:`REGISTRY`; randomness comes from the streams of
``rayfl/rng.py``, so results stay independent of placement.

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

from rayfl import schema
from rayfl.layers import ClientContext, Facts
from rayfl.schema import ConfigError, NoParams
from rayfl.transforms.base import ClipParams, ClipUpdate, Identity, Transform
from rayfl.transforms.compress import QSGD, RandK, TopK, entry_of
from rayfl.transforms.dp import GaussianDP
from rayfl.transforms.robust import Attack, Krum, Median, TrimmedMean
from rayfl.transforms.secagg import SecAgg

__all__ = ["ClientContext", "ClipParams", "ClipUpdate", "Identity", "NoParams", "Transform",
           "REGISTRY", "transforms_of"]


REGISTRY: dict[str, type[Transform]] = {cls.name: cls for cls in (
    Identity, ClipUpdate, QSGD, TopK, RandK, SecAgg, Median, TrimmedMean, Krum, Attack)}


def validate(entries: list[dict], key: str = "aggregation.transforms") -> list[dict]:
    """Check every ``{name: ..., <params>}`` entry (ConfigError naming the bad key)."""
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        name = entry.get("name")
        if name not in REGISTRY:
            raise ConfigError(f"{where}.name", name, "one of " + ", ".join(sorted(REGISTRY)))
        schema.build(REGISTRY[name].Params, {k: v for k, v in entry.items() if k != "name"},
                     where)
    return entries


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
        cls = REGISTRY[entry["name"]]
        yield where, cls, schema.build(cls.Params, {k: v for k, v in entry.items()
                                                    if k != "name"}, where)


def check_run(cfg) -> None:
    """Every step's cross-section rules (e.g. SecAgg needs uniform weighting)."""
    for where, cls, params in _configured(cfg):
        cls.check_config(params, cfg, where)


def check_data(cfg, handle) -> None:
    """Every step's rules on the partition (e.g. label flipping needs class labels)."""
    for where, cls, params in _configured(cfg):
        cls.check_data(params, handle, where)


def transforms_of(cfg, facts: Facts | None = None) -> list[Transform]:
    """The configured transforms: ``aggregation.transforms``, the ``compression`` step and
    DP-FedAvg's mechanism when ``privacy`` is set (the stack puts SecAgg's transport last);
    ``facts`` default to the config's own (seed, rounds, clients per round, clients)."""
    if facts is None:
        facts = Facts(cfg.seed, cfg.rounds, cfg.clients_per_round, cfg.data.num_clients)
    steps: list[Transform] = [cls(params, facts) for _, cls, params in _configured(cfg)]
    if cfg.privacy is not None:
        steps.append(GaussianDP.of(cfg.privacy, facts))
    return steps

