"""Aggregation transforms: steps every client update, and then the round's sum, pass through.

A transform sees each client's update Δ_i inside the worker that trained it (``client``), before
it is summed, and the round's :class:`Aggregate` at the server (``aggregate``), before the
algorithm's server update. Client sides run in the order of the chain and server sides in the
reverse order (a stack: the last encoder on the client is the first decoder at the server), so
they compose with every algorithm: this is where clipping, noise, quantisation, compression and
secure-aggregation arithmetic plug in. A transform is a class with a ``Params`` dataclass (its
config keys) registered in :data:`REGISTRY`; randomness must come from generators keyed by
(seed, round, client, purpose) so results stay independent of placement.

Beyond Δ_i a step may use (see :class:`ClientContext`): values the server broadcasts with the
model (``broadcast``, e.g. an adaptive clip norm), persistent per-client vectors that live in
the client's state in the state store (error-feedback residuals: saved, spilled, checkpointed
and resumed like algorithm state) and scalars summed over the round's clients into
``agg.extras`` (e.g. a clipped-count); server-side state of its own (``server_state``) is
checkpointed with the run. ``upload_bytes`` is what one client would send for its update Δ_i
(an algorithm's extra payload, e.g. SCAFFOLD's Δc_i, is not counted); the chain composes it, it
is reported as ``upload_bytes`` per round and times the upload on the virtual clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from rayfl import schema
from rayfl.algorithms.base import Aggregate, Vec
from rayfl.schema import ConfigError, NoParams

#: prefix of the broadcast and client-state keys that belong to transforms, not the algorithm
RESERVED = "_transform"


@dataclass
class ClientContext:
    """What one step may read and write for one client: the server's broadcast values, its own
    persistent client state (read, and replace entries to keep them) and scalars to sum."""

    broadcast: dict[str, Vec] = field(default_factory=dict)
    state: dict[str, Vec] = field(default_factory=dict)
    payload: dict[str, float] = field(default_factory=dict)


class Transform:
    """Identity by default; subclasses override what they change."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    #: runs after every other step on the client (and first at the server): SecAgg's transport
    transport: ClassVar[bool] = False
    #: the server side reads every client's update at once (``Aggregate.updates``): robust rules
    needs_updates: ClassVar[bool] = False

    def __init__(self, params: Any = None, seed: int = 0):
        self.p = params if params is not None else self.Params()
        self.seed = seed

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        """Client ``client``'s update Δ_i of round ``t`` as it is summed."""
        return delta

    def client_apply(self, delta: Vec, t: int, client: int, ctx: ClientContext) -> Vec:
        """:meth:`client` with the client's context (steps with state or broadcasts override)."""
        return self.client(delta, t, client)

    def client_labels(self, labels: torch.Tensor, client: int, num_classes: int) -> torch.Tensor:
        """The labels client ``client`` trains on (a label-flipping attacker changes them)."""
        return labels

    def aggregate(self, agg: Aggregate, t: int) -> Aggregate:
        """The round's aggregate as the server algorithm sees it."""
        return agg

    def broadcast(self, t: int) -> dict[str, Vec]:
        """Values every client of round ``t`` receives for this step."""
        return {}

    def upload_bytes(self, numel: int, incoming: float) -> float:
        """Bytes one client sends for a ``numel``-vector that took ``incoming`` bytes so far."""
        return incoming

    def metrics(self) -> dict[str, float]:
        """This step's numbers for the round just aggregated."""
        return {}

    def server_state(self) -> dict:
        """Server-side state of this step (plain data; checkpointed)."""
        return {}

    def load_server_state(self, state: dict) -> None:
        """Restore :meth:`server_state` after a resume."""

    @classmethod
    def check_config(cls, params: Any, cfg, where: str) -> None:
        """Cross-section rules for a run (ConfigError naming the key)."""

    @classmethod
    def check_data(cls, params: Any, handle, where: str) -> None:
        """Rules tying the step to the partition behind ``handle`` (ConfigError naming the
        key), checked before a run starts."""

    @classmethod
    def from_run(cls, params: Any, cfg) -> "Transform":
        """The step of a run (a step may fill defaults from the run's config)."""
        return cls(params, cfg.seed)


class Identity(Transform):
    """Leaves every update and the sum unchanged."""

    name = "identity"


@dataclass(frozen=True)
class ClipParams:
    """Per-client update-norm clipping."""

    max_norm: float = schema.field(1.0, doc="S: each client update Δ_i is scaled to ‖Δ_i‖ ≤ S",
                                   lo=0.0, lo_open=True)


class ClipUpdate(Transform):
    """Δ_i ← Δ_i · min(1, S / (‖Δ_i‖ + 1e-6)) (``torch.nn.utils.clip_grad_norm_``'s rule), the
    user-level clipping of DP-FedAvg and norm bounding against attackers (Sun et al., 2019); a
    client's own state still sees its unclipped model."""

    name = "clip"
    Params = ClipParams

    @classmethod
    def search_space(cls) -> dict[str, dict]:
        """The tuner's preset ``clip``: the norm bound S."""
        return {"aggregation.transforms.clip.max_norm": {"low": 0.1, "high": 10.0, "log": True}}

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        norm = torch.linalg.vector_norm(delta)
        return delta * torch.clamp(self.p.max_norm / (norm + 1e-6), max=1.0)


REGISTRY: dict[str, type[Transform]] = {"identity": Identity, "clip": ClipUpdate}


def _register_builtins() -> None:
    from rayfl.transforms.compress import QSGD, RandK, TopK
    from rayfl.transforms.robust import Attack, Krum, Median, TrimmedMean
    from rayfl.transforms.secagg import SecAgg

    for cls in (QSGD, TopK, RandK, SecAgg, Median, TrimmedMean, Krum, Attack):
        REGISTRY[cls.name] = cls


class Chain:
    """Transforms applied in order on the client, in reverse order at the server."""

    def __init__(self, steps: list[Transform]):
        self.steps = steps
        #: whether the server must receive every client's update, not only their sum
        self.needs_updates = any(step.needs_updates for step in steps)

    def _key(self, i: int, name: str) -> str:
        return f"{RESERVED}{i}_{name}"

    def client(self, delta: Vec, t: int, client: int) -> Vec:
        """Δ_i through every step's client side (no broadcast, no state)."""
        return self.apply(delta, t, client)[0]

    def client_labels(self, labels: torch.Tensor, client: int, num_classes: int) -> torch.Tensor:
        """The labels ``client`` trains on, through every step."""
        for step in self.steps:
            labels = step.client_labels(labels, client, num_classes)
        return labels

    def apply(self, delta: Vec, t: int, client: int, broadcast: dict | None = None,
              state: dict | None = None) -> tuple[Vec, dict[str, Vec], dict[str, float]]:
        """(Δ_i as summed, the transforms' new client state, scalars to sum) for one client.

        ``broadcast`` and ``state`` hold only reserved keys (see :func:`split`)."""
        broadcast, state = broadcast or {}, state or {}
        new_state, payload = {}, {}
        for i, step in enumerate(self.steps):
            pre = self._key(i, "")
            ctx = ClientContext({k[len(pre):]: v for k, v in broadcast.items()
                                 if k.startswith(pre)},
                                {k[len(pre):]: v for k, v in state.items() if k.startswith(pre)})
            delta = step.client_apply(delta, t, client, ctx)
            new_state.update({pre + k: v for k, v in ctx.state.items()})
            payload.update({pre + k: v for k, v in ctx.payload.items()})
        return delta, new_state, payload

    def broadcast(self, t: int) -> dict[str, Vec]:
        """Every step's values for the clients of round ``t`` (reserved keys)."""
        return {self._key(i, k): v for i, step in enumerate(self.steps)
                for k, v in step.broadcast(t).items()}

    def aggregate(self, agg: Aggregate, t: int) -> Aggregate:
        """The round's aggregate through every step's server side, last step first."""
        mine = {k: v for k, v in agg.extras.items() if k.startswith(RESERVED)}
        agg = dataclasses.replace(agg, extras={k: v for k, v in agg.extras.items()
                                               if not k.startswith(RESERVED)})
        for i in reversed(range(len(self.steps))):
            pre = self._key(i, "")
            own = {k[len(pre):]: v for k, v in mine.items() if k.startswith(pre)}
            agg = self.steps[i].aggregate(dataclasses.replace(
                agg, extras={**agg.extras, **own}), t)
            agg = dataclasses.replace(agg, extras={k: v for k, v in agg.extras.items()
                                                   if k not in own})
        return agg

    def upload_bytes(self, numel: int, element_size: int = 4) -> float:
        """Bytes one client uploads for a ``numel``-parameter update (dense: numel × size)."""
        size = float(numel * element_size)
        for step in self.steps:
            size = step.upload_bytes(numel, size)
        return size

    def metrics(self) -> dict[str, float]:
        out = {}
        for step in self.steps:
            out.update(step.metrics())
        return out

    def server_state(self) -> list[dict]:
        return [step.server_state() for step in self.steps]

    def load_server_state(self, states: list[dict] | None) -> None:
        for step, state in zip(self.steps, states or []):
            step.load_server_state(state)


def split(values: dict | None) -> tuple[dict, dict | None]:
    """(the transforms' reserved entries, the rest or None when nothing is left) of a
    broadcast or client-state dict."""
    if not values:
        return {}, values
    mine = {k: v for k, v in values.items() if k.startswith(RESERVED)}
    rest = {k: v for k, v in values.items() if not k.startswith(RESERVED)}
    return mine, (rest or None) if mine else values


def round_metrics(chain: "Chain | None", completed: int, numel: int,
                  element_size: int) -> dict[str, float]:
    """``upload_bytes`` of the round's completed clients, and the chain's own metrics."""
    per_client = float(numel * element_size) if chain is None else chain.upload_bytes(
        numel, element_size)
    return {"upload_bytes": per_client * completed,
            **({} if chain is None else chain.metrics())}


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
        from rayfl.transforms.compress import entry_of

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


def transforms_from_config(cfg) -> Chain | None:
    """The configured chain (None: empty): ``aggregation.transforms``, the ``compression``
    step, DP-FedAvg's mechanism when ``privacy`` is set, and SecAgg's transport last."""
    steps = [cls.from_run(params, cfg) for _, cls, params in _configured(cfg)]
    if cfg.privacy is not None:
        from rayfl.transforms.dp import GaussianDP

        steps.append(GaussianDP.from_privacy(cfg))
    steps = [s for s in steps if not s.transport] + [s for s in steps if s.transport]
    return Chain(steps) if steps else None


_register_builtins()
