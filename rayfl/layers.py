"""A run as a stack of layers, each owning one typed slot of the state.

The algorithm is the innermost layer; around it sit the server wrappers (IMA, a moving average,
a schedule: the ``wrappers`` section, innermost first) and the aggregation transforms (clipping,
compression, DP, SecAgg, robust rules, attackers: ``aggregation.transforms``). A wrapper and a
transform are the same kind of thing, a :class:`Layer`, with

- an optional *client half*: after local training it sees the client's upload and may change it
  (:meth:`Layer.client_apply`), keep a client slot of its own (error-feedback residuals) and add
  to a payload summed over the round into its own sums (a wrapper asking its clients for their
  training loss);
- a *server half*: over the round's aggregate on the way in (:meth:`Layer.aggregate`) and over
  the new model on the way out (:meth:`Layer.after`), with a server slot of its own; it may set
  the clients' learning rate from that slot (:meth:`Layer.client_lr`) and the model deployed.

Client halves run in stack order and server halves in reverse (the last encoder on the client is
the first decoder at the server), as pfl-research's postprocessors do; then the algorithm's
server update (stepping the server optimiser, a slot of its own), then each layer's
:meth:`Layer.after`, innermost first. The state is a tree — :class:`ServerState` on the server,
:class:`ClientState` per client, :class:`Broadcast` per round — with one slot per layer: no
layer reads or writes another's, and checkpoints, resume and fork check the tree by its
structure (``structure`` and ``mismatch`` below).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from rayfl.algorithms.base import Aggregate, Algorithm, Collected, ServerRound, Vec, built_as
from rayfl.algorithms.server_opt import ServerOpt
from rayfl.contract import (ComponentError, Lent, Trail, calling, describe, expect, name_of,
                            no_new_non_finite, returned, returned_metrics, returned_vector)
from rayfl.metrics.columns import written_by_runtime
from rayfl.runtime.checkpoint_file import unencodable_tree
from rayfl.schema import NoParams


@dataclass(frozen=True)
class Facts:
    """The few facts about a run that a layer may need beside its own section."""

    seed: int = 0
    rounds: int = 1
    clients_per_round: int = 1
    num_clients: int = 1
    #: the server optimiser has per-coordinate step sizes (FedAdam, FedYogi, FedAdagrad)
    adaptive_server_opt: bool = False


@dataclass(frozen=True)
class LayerTraits:
    """What a layer needs and what it refuses (None: accepted; a string: the reason)."""

    #: the server half reads every client's upload at once (``Aggregate.updates``): robust rules
    needs_updates: bool = False
    #: runs after every other client half (and first at the server): SecAgg's transport
    transport: bool = False
    #: why FedBuff / FedAsync are refused
    asynchronous: str | None = None
    #: why models with buffers (BatchNorm statistics) are refused
    buffers: str | None = None
    #: it averages server models over rounds: refused around an algorithm whose traits say why
    #: that is undefined for it (``Traits.averaging``)
    averages_rounds: bool = False
    #: the further model (:meth:`Layer.extra_models`) holding the model under this layer
    inner_model: str | None = None
    #: the tuner's preset: dotted run-config key -> parameter spec
    search_space: dict = field(default_factory=dict)
    #: it privatises what leaves a client (the DP mechanism): every other report a client
    #: sends beside the upload must be one it accounts for or one declared public; the sums
    #: of the algorithm's Upload entries (``Aggregate.uploaded``) are its to noise too
    privatises: bool = False
    #: its client half's payload keys that carry no client data (chosen by the seed, not
    #: the data): allowed beside a privatising layer
    public_reports: tuple[str, ...] = ()
    #: why an algorithm's :class:`~rayfl.algorithms.base.Upload` entries are refused beside
    #: it (None: its halves act on them as on the upload, but for a layer that reads every
    #: upload at once, which refuses them: it would sum them unprotected)
    uploads: str | None = None
    #: its server half acts on the sums of the algorithm's Upload entries (``agg.uploaded``) as
    #: on the update's (DP noises them, SecAgg decodes them): a layer that privatises or is a
    #: transport and does not say so refuses them
    upload_sums: bool = False


@dataclass
class ClientContext:
    """What a layer's client half sees for one client: the round and client, the client's
    training loss, weight and samples, its own broadcast values, its own persistent client slot
    (read it; set entries to keep them), a payload summed over the round into its own sums, and
    the model's size ``dim`` (the upload's first ``dim`` numbers are the update; an algorithm's
    Upload entries follow)."""

    t: int = 0
    client: int = 0
    loss: float = float("nan")
    weight: float = 1.0
    samples: int = 0
    broadcast: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    dim: int = 0


class Layer:
    """Identity by default: a wrapper or a transform overrides the halves it changes."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = NoParams
    traits: ClassVar[LayerTraits] = LayerTraits()

    def __init__(self, params: Any = None, facts: Facts | None = None):
        self.params = params if params is not None else self.Params()
        self.facts = facts if facts is not None else Facts()

    @property
    def p(self) -> Any:
        """The layer's validated keys (its ``Params``)."""
        return self.params

    @property
    def seed(self) -> int:
        return self.facts.seed

    @classmethod
    def check_config(cls, params: Any, cfg: Any, where: str) -> None:
        """Rules on its own keys that involve other sections (ConfigError naming the key)."""

    @classmethod
    def check_data(cls, params: Any, handle: Any, where: str) -> None:
        """Rules tying the layer to the partition behind ``handle`` (ConfigError naming the
        key), checked before a run starts."""

    # ----- server slot ---------------------------------------------------------------------
    def init(self, x0: Vec) -> Any:
        """The layer's server slot at the start (None: it keeps none)."""
        return None

    def broadcast(self, slot: Any, t: int) -> dict[str, Vec]:
        """Values every client of round ``t`` receives for this layer's client half."""
        return {}

    def client_lr(self, slot: Any, t: int, inner: Callable[[int], float]) -> float:
        """The clients' learning rate of round ``t`` (``inner(t)``: the rate under this layer)."""
        return inner(t)

    # ----- client half ---------------------------------------------------------------------
    def client(self, delta: Vec, t: int, client: int) -> Vec:
        """Client ``client``'s upload Δ_i of round ``t`` as it leaves this layer: the shortcut
        :meth:`client_apply` calls, for a step without per-client state, broadcast values or
        ``Upload`` entries to tell from the update."""
        return delta

    def client_apply(self, delta: Vec, t: int, client: int, ctx: ClientContext) -> Vec:
        """Client ``client``'s upload Δ_i of round ``t`` as it leaves this layer (by default
        :meth:`client`'s)."""
        return self.client(delta, t, client)

    def client_labels(self, labels: torch.Tensor, client: int, num_classes: int) -> torch.Tensor:
        """The labels client ``client`` trains on (a label-flipping attacker changes them)."""
        return labels

    def upload_bytes(self, numel: int, incoming: float) -> float:
        """Bytes one client sends for a ``numel``-vector that took ``incoming`` bytes so far."""
        return incoming

    # ----- server half ---------------------------------------------------------------------
    def aggregate(self, slot: Any, agg: Aggregate, sums: dict, srv: ServerRound
                  ) -> tuple[Aggregate, Any, dict]:
        """On the way in: the aggregate as the layers under it see it, this layer's new slot and
        its metrics (``sums``: its own payload summed over the round)."""
        return agg, slot, {}

    def after(self, slot: Any, x: Vec, srv: ServerRound) -> tuple[Vec, Any, dict]:
        """On the way out: the model after the update under it, the new slot and metrics
        (``srv.deployed``: the model the layers under it deploy now)."""
        return x, slot, {}

    def deployed(self, slot: Any, x: Vec) -> Vec:
        """The model deployed, from the one deployed under this layer."""
        return x

    def extra_models(self, slot: Any, inner: Vec) -> dict[str, Vec]:
        """Further models to evaluate (``inner``: the model deployed under this layer)."""
        if self.traits.inner_model and slot is not None:
            return {self.traits.inner_model: inner}
        return {}

    def check_reports(self, sent: list[tuple[str, str]], t: int | None) -> None:
        """In a layer that privatises the upload: refuse what clients sent beside it that it
        does not account for (``sent``: (sender, key), the reports no trait declares public);
        by default every one."""
        for sender, key in sent:
            raise ComponentError(sender, f"sent {key!r} to the server beside the update that "
                                         f"{name_of(type(self))} privatises: it leaves every "
                                         "client unprivatised, outside its account", t)

    def fork(self, slot: Any, next_round: int, source: "Layer") -> Any:
        """The slot a run forked from ``source``'s checkpoint continues with from round
        ``next_round`` (ValueError saying why when it cannot)."""
        return slot

    def from_legacy(self, old: dict) -> Any:
        """The slot from a rayfl 0.1 checkpoint (the layer's entries there: a transform's own
        state dict, or the flat server state for a wrapper); default: a fresh slot."""
        return self.init(None)


def declaration_problem(cls: type) -> str | None:
    """What is wrong with what a layer class declares of itself (its traits record, how it is
    built), or None."""
    if not isinstance(cls.traits, LayerTraits):
        return (f"a layer whose traits is a LayerTraits record (rayfl.layers.LayerTraits(...)); "
                f"its traits is {describe(cls.traits)}")
    return built_as(cls, "a layer", "cls(params, facts)", None, Facts())


# ----- the state tree ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ServerState:
    """The server's state: the model, then one slot per layer."""

    x: Vec  # the server model the algorithm steps (what it deploys is its own choice)
    algorithm: Any  # the algorithm's ``State`` (a frozen dataclass) or None
    server_opt: Any  # the server optimiser's state
    wrappers: tuple  # one slot per wrapper, innermost first
    transforms: tuple  # one slot per transform, in client order
    buffers: Vec | None = None  # the global model's buffers (BatchNorm statistics)


@dataclass(frozen=True)
class Broadcast:
    """What a round's clients receive: the algorithm's values, each layer's, the buffers."""

    algorithm: dict
    layers: tuple
    buffers: Vec | None = None


@dataclass(frozen=True)
class ClientState:
    """One client's persistent state: the algorithm's entries, each layer's, its own buffers."""

    algorithm: dict | None = None
    layers: tuple = ()
    buffers: Vec | None = None

    def empty(self) -> bool:
        return self.algorithm is None and not any(self.layers) and self.buffers is None


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``fn`` applied to every tensor and array (dataclasses, tuples, lists and
    dicts rebuilt)."""
    if isinstance(tree, (torch.Tensor, np.ndarray)):
        return fn(tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(tree, **{f.name: tree_map(fn, getattr(tree, f.name))
                                            for f in dataclasses.fields(tree) if f.init})
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, v) for v in tree)
    if isinstance(tree, list):
        return [tree_map(fn, v) for v in tree]
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    return tree


def structure(tree: Any, path: str = "state", field_of_slot: bool = False,
              root: bool = True) -> dict[str, str]:
    """Path -> kind of every leaf of ``tree``: the shape a checkpoint's tree must have (a slot's
    class and fields, a tensor's shape and dtype). A slot's field that is None is ``optional``:
    filled later (fedmsi's graph after its set-up); a whole slot that is None keeps nothing."""
    out: dict[str, str] = {}
    if isinstance(tree, torch.Tensor):
        out[path] = f"tensor{tuple(tree.shape)} {str(tree.dtype).replace('torch.', '')}"
    elif hasattr(tree, "slot_name"):  # a checkpoint's slot this run has no class for
        out[path] = tree.slot_name
        for k in sorted(tree.fields):
            out.update(structure(tree.fields[k], f"{path}.{k}", True, False))
    elif dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        out[path] = type(tree).__name__
        for f in dataclasses.fields(tree):  # the tree's own fields are slots, not optional
            out.update(structure(getattr(tree, f.name), f"{path}.{f.name}", not root, False))
    elif isinstance(tree, tuple):  # one entry per layer: its length is structure
        out[path] = f"tuple of {len(tree)}"
        for i, v in enumerate(tree):
            out.update(structure(v, f"{path}[{i}]", root=False))
    elif isinstance(tree, list):  # a history that grows: its length is not
        out[path] = "list"
    elif isinstance(tree, dict):
        out[path] = "dict"
        for k in sorted(tree):
            out.update(structure(tree[k], f"{path}.{k}", root=False))
    elif tree is None:
        out[path] = "optional" if field_of_slot else "nothing"
    else:
        out[path] = type(tree).__name__
    return out


def mismatch(expected: Any, found: Any) -> str | None:
    """The first difference between the structures of two trees, in words (None: the same,
    tensor shapes of variable-length slots aside; an ``optional`` field of ``expected``
    matches anything)."""
    a = structure(expected)
    return _difference(a, structure(found), [p for p, kind in a.items() if kind == "optional"])


def slot_mismatch(before: Any, after: Any) -> str | None:
    """:func:`mismatch` between a layer's slot and the one it returned, as they sit in the
    state's tree: a field that is None on either side (filled later, or emptied) matches."""
    a, b = structure(before, "slot", root=False), structure(after, "slot", root=False)
    return _difference(a, b, [p for tree in (a, b) for p, kind in tree.items()
                              if kind == "optional"])


def _difference(a: dict, b: dict, optional: list[str]) -> str | None:
    for path in sorted(set(a) | set(b)):
        if any(path == p or path.startswith((p + ".", p + "[")) for p in optional):
            continue
        if a.get(path) != b.get(path):
            if (a.get(path) or "").startswith("tensor") and (b.get(path) or "").startswith(
                    "tensor"):
                continue  # a window or a history grows: its length is not structure
            return f"{path}: expected {a.get(path, 'nothing')}, found {b.get(path, 'nothing')}"
    return None


def legacy_slot(template: Any, flat: dict) -> Any:
    """A slot dataclass filled from a rayfl 0.1 flat state: each field from the entry of its
    name, or of the name the dataclass's ``LEGACY`` mapping (old name -> field) gives it."""
    if template is None or not dataclasses.is_dataclass(template):
        return template
    old_name = {new: old for old, new in getattr(type(template), "LEGACY", {}).items()}
    values = {f.name: flat[old_name.get(f.name, f.name)] for f in dataclasses.fields(template)
              if old_name.get(f.name, f.name) in flat}
    return dataclasses.replace(template, **values)


# ----- payloads -----------------------------------------------------------------------------
def summed_uploads(extras: dict, uploaded) -> list[str]:
    """The keys of ``uploaded`` (an aggregate's Upload entries) that are summed, not collected
    row by row: a privatising layer noises them with the update's sum (inside its account) and
    SecAgg decodes them with it."""
    return [k for k in uploaded if not isinstance(extras.get(k), Collected)]


def add(a: Any, b: Any) -> Any:
    """``a + b`` for summed payload values (a None sum starts from a copy of ``b``)."""
    if a is None:
        return b.clone() if isinstance(b, torch.Tensor) else b
    return a + b


def _values(arr: np.ndarray | None) -> str:
    """`` with min …`` of a 1-d array of numbers (NaN when one is), to show what was wrong."""
    return f" with min {np.min(arr)}" if arr is not None and arr.ndim == 1 and arr.size else ""


def tensors(value: Any, component: str, what: str, round: int | None = None) -> dict:
    """``value`` checked to be a dict of names to tensors (what a broadcast, a round message or
    a layer's payload holds: only tensors travel to the clients and into state files)."""
    expect(isinstance(value, dict), component,
           f"returned {what} as {describe(value)}; expected a dict of name -> torch.Tensor",
           round)
    for k, v in value.items():
        expect(isinstance(k, str) and isinstance(v, torch.Tensor), component,
               f"returned {what} whose {k!r} is {describe(v)}; expected a torch.Tensor "
               "(torch.as_tensor(...) it)", round)
    return value


def checkpointable(value: Any, component: str, what: str, round: int | None = None) -> Any:
    """``value`` checked to be what a checkpoint holds (tensors, arrays, numbers, strings,
    lists, tuples, str-keyed dicts and dataclasses of them)."""
    found = unencodable_tree(value)
    expect(found is None, component,
           f"returned {what} holding {found}, which a checkpoint cannot hold (tensors, arrays, "
           "numbers, strings, lists, dicts and dataclasses of them)", round)
    return value


def kept_slot(before: Any, after: Any, component: str, t: int) -> Any:
    """A layer's returned slot checked: what a checkpoint holds, in the structure of the slot it
    was given (a resume rebuilds it in that structure)."""
    checkpointable(after, component, "a slot", t)
    problem = slot_mismatch(before, after)
    expect(problem is None, component, f"returned a slot of another structure than the one it "
                                       f"was given ({problem}); a slot keeps its structure", t)
    return after


def _taken(metric: str) -> str:
    return (f"returned metric {metric!r}, a column the runtime writes itself (METRICS.md): "
            "name it apart")


def _numbers(agg: Aggregate) -> list:
    """The tensors and numbers of an aggregate that the server's model update reads (not
    ``delta_sq_sum``, a drift statistic that DP's noised sum leaves NaN: unknown)."""
    return [v for v in (agg.delta_mean, agg.delta_sum, agg.updates, agg.buffers_mean,
                        agg.weight_sum) if v is not None]


def _add_metrics(metrics: dict, owners: dict, new: dict, component: str, t: int) -> None:
    """A layer's metrics added to the round's (``owners``: each name's component): a name the
    runtime writes or one already returned this round is refused (one value would silently
    replace the other)."""
    for k in new:
        expect(not written_by_runtime(k), component, _taken(k), t)
        expect(k not in owners, component, f"returned metric {k!r}, which {owners.get(k)} "
                                           "returned this round too: name it apart", t)
        owners[k] = component
    metrics.update(new)


def _payload_sums(name: str, sums: dict, t: int | None) -> None:
    """A layer's payload sums checked (``name``: its ``client_apply``): tensors or numbers (what
    the client half adds to ``ctx.payload``, summed over the round's clients, as an algorithm's
    payload is)."""
    expect(isinstance(sums, dict), name,
           f"filled its payload with {describe(sums)}; expected a dict of name -> value", t)
    for k, v in sums.items():
        expect(isinstance(v, (torch.Tensor, numbers.Real)) and not isinstance(v, bool), name,
               f"put payload entry {k!r} that is {describe(v)}: payload values are tensors or "
               "numbers, summed over the round's clients", t)


def _rate(name: str, lr: Any, t: int) -> float:
    """A layer's client learning rate (``name``: its ``client_lr``), checked to be a finite
    number ≥ 0."""
    expect(isinstance(lr, numbers.Real) and math.isfinite(lr) and lr >= 0, name,
           f"returned {lr!r} as the clients' learning rate; expected a finite number ≥ 0", t)
    return float(lr)


# ----- the stack ---------------------------------------------------------------------------------
class Stack:
    """The algorithm, its server optimiser and the layers around it (the wrappers and the
    transforms, innermost first)."""

    def __init__(self, algorithm: Algorithm, optimizer: ServerOpt,
                 wrappers: list[Layer] | None = None, transforms: list[Layer] | None = None,
                 where: list[str] | None = None):
        given = [("wrapper", w) for w in wrappers or []] + \
            [("transform", t) for t in transforms or []]
        where = where or [f"layers[{i}]" for i in range(len(given))]
        self._build(algorithm, optimizer, [(w, k, layer) for w, (k, layer) in zip(where, given)])

    @classmethod
    def of(cls, algorithm: Algorithm, optimizer: ServerOpt,
           layers: list[tuple[str, str, Layer]]) -> "Stack":
        """The stack of ``layers``, each (config key, kind ``wrapper`` or ``transform``, layer)
        in the order the config gives them, innermost first."""
        stack = cls.__new__(cls)
        stack._build(algorithm, optimizer, list(layers))
        return stack

    def _build(self, algorithm: Algorithm, optimizer: ServerOpt,
               given: list[tuple[str, str, Layer]]) -> None:
        self.algorithm, self.optimizer = algorithm, optimizer
        ordered = [e for e in given if not e[2].traits.transport] + \
            [e for e in given if e[2].traits.transport]  # a transport (SecAgg) runs last
        #: config key, kind and layer of each, in client order
        self.where = [w for w, _, _ in ordered]
        self.kinds = [k for _, k, _ in ordered]
        self.layers = [layer for _, _, layer in ordered]
        self.wrappers = [x for k, x in zip(self.kinds, self.layers) if k == "wrapper"]
        self.transforms = [x for k, x in zip(self.kinds, self.layers) if k == "transform"]
        types = [type(layer) for layer in self.layers]
        #: where each layer is configured, said in its errors when its class is there twice
        self._at = [f" at {w}" if types.count(type(layer)) > 1 else ""
                    for w, layer in zip(self.where, self.layers)]
        self.needs_updates = any(layer.traits.needs_updates for layer in self.layers)
        #: the layer that privatises the upload (DP), or None
        self.privatiser = next((layer for layer in self.layers if layer.traits.privatises),
                               None)

    def name(self, i: int, method: str) -> str:
        """``module:Name.method`` of layer ``i`` (client order), with where it is configured
        when another layer is of its class."""
        return f"{name_of(self.layers[i], method)}{self._at[i]}"

    def client_half(self, i: int) -> str:
        """``module:Name.method`` of layer ``i``'s client half: its ``client`` when that is the
        one it overrides, else its ``client_apply``."""
        cls = type(self.layers[i])
        shortcut = cls.client_apply is Layer.client_apply and cls.client is not Layer.client
        return self.name(i, "client" if shortcut else "client_apply")

    def _slots(self, state: ServerState) -> list:
        """The state's layer slots in client order (the tree keeps the wrappers' and the
        transforms' apart, as rayfl 0.1 and 0.2 checkpoints do)."""
        own = {"wrapper": iter(state.wrappers), "transform": iter(state.transforms)}
        return [next(own[k], None) for k in self.kinds]

    def _split(self, slots: list) -> tuple[tuple, tuple]:
        """(the wrappers' slots, the transforms' slots) of slots in client order."""
        return tuple(s for s, k in zip(slots, self.kinds) if k == "wrapper"), \
            tuple(s for s, k in zip(slots, self.kinds) if k == "transform")

    # ----- server ------------------------------------------------------------------------
    def init(self, x0: Vec, buffers: Vec | None = None) -> ServerState:
        """The state of a fresh run from the model x_0 (and its buffers)."""
        slots = []
        for i, layer in enumerate(self.layers):
            name = self.name(i, "init")
            with calling(name):
                slots.append(checkpointable(layer.init(x0), name, "a slot"))
        wrappers, transforms = self._split(slots)
        name = name_of(self.algorithm, "server_init")
        with calling(name):
            own = self.algorithm.server_init(x0)
        expect(own is None or dataclasses.is_dataclass(own) and not isinstance(own, type)
               and type(own).__dataclass_params__.frozen, name,
               f"returned {describe(own)}"
               f"{', a dataclass that is not frozen' if dataclasses.is_dataclass(own) else ''}; "
               "expected a frozen dataclass instance (its state: @dataclass(frozen=True)) or "
               "None")
        checkpointable(own, name, "a state")
        name = name_of(self.optimizer.init)
        with calling(name):
            opt = checkpointable(self.optimizer.init(x0), name, "a server optimiser state")
        return ServerState(x0.clone(), own, opt, wrappers, transforms, buffers)

    def broadcast(self, state: ServerState, t: int) -> Broadcast:
        """What the clients trained from server update ``t`` receive."""
        algorithm, own = self._algorithm_broadcast(state, t), []
        for i, (layer, slot) in enumerate(zip(self.layers, self._slots(state))):
            name = self.name(i, "broadcast")
            with calling(name, round=t):
                own.append(tensors(layer.broadcast(slot, t), name, "its broadcast", t))
        return Broadcast(algorithm, tuple(own), state.buffers)

    def start(self, state: ServerState, t: int) -> Vec:
        """Where the clients of server update ``t`` start from."""
        return self._algorithm_broadcast(state, t)["x"]

    def _algorithm_broadcast(self, state: ServerState, t: int) -> dict[str, Vec]:
        """The algorithm's broadcast, checked: a dict whose ``x`` is shaped like the model."""
        name = name_of(self.algorithm, "broadcast")
        with calling(name, round=t):
            bc = self.algorithm.broadcast(state.x, state.algorithm, t)
        expect(isinstance(bc, dict) and "x" in bc, name,
               f"returned {describe(bc)}{'' if not isinstance(bc, dict) else ' without x'}; "
               "expected a dict with the model the clients start from under 'x'", t)
        returned_vector(bc["x"], state.x, name, "its 'x'", t)
        no_new_non_finite([state.x, bc["x"]], [name], "an 'x'", t)
        return tensors(bc, name, "its broadcast", t)

    def weights(self, state: ServerState, clients: np.ndarray, sizes: np.ndarray
                ) -> np.ndarray:
        """The algorithm's aggregation weights of ``clients``, checked: one finite number ≥ 0
        each."""
        name = name_of(self.algorithm, "aggregation_weights")
        with calling(name):
            w = self.algorithm.aggregation_weights(state.algorithm, clients, sizes)
        try:
            arr = np.asarray(w, dtype=np.float64)
        except (TypeError, ValueError):
            arr = None
        expect(arr is not None and arr.shape == (len(clients),) and bool(np.isfinite(arr).all())
               and bool((arr >= 0).all()), name,
               f"returned {describe(w)}{_values(arr)}; expected {len(clients)} finite weights "
               "≥ 0, one per client", None)
        return arr

    def client_lr(self, state: ServerState, t: int, lr0: float, decay: float) -> float:
        """η_l of round ``t``: η_0 · decay^t under the layers' own schedules (each checked to
        give a finite rate ≥ 0)."""
        rate: Callable[[int], float] = lambda s: lr0 * decay**s  # noqa: E731
        for i, (layer, slot) in enumerate(zip(self.layers, self._slots(state))):
            rate = (lambda s, layer=layer, slot=slot, inner=rate, name=self.name(i, "client_lr"):
                    _rate(name, layer.client_lr(slot, s, inner), s))
        return rate(t)

    def update(self, state: ServerState, agg: Aggregate, sums: tuple, t: int
               ) -> tuple[ServerState, Aggregate, dict]:
        """Server update ``t``: the layers' server halves on the way in (last layer first), the
        algorithm's update with the server optimiser, the layers' halves on the way out;
        returns (state, the aggregate as the algorithm saw it, metrics)."""
        self.payload_sums(sums, t)
        rows = [k for k, v in agg.extras.items() if isinstance(v, Collected)]
        self.check_payload([k for k in agg.extras if k not in rows], rows, agg.uploaded, sums, t)
        srv = ServerRound(t, state.x, self.algorithm.num_clients, self.optimizer,
                          state.server_opt)
        slots, metrics, owners = self._slots(state), {}, {}
        aggregates = Trail("an aggregate", agg, _numbers)
        for i in reversed(range(len(self.layers))):
            name = self.name(i, "aggregate")
            with calling(name, round=t):
                out = self.layers[i].aggregate(slots[i], agg, sums[i], srv)
            given = agg
            agg, slot, m = returned(out, ("aggregate", "slot", "metrics"), name, t)
            expect(isinstance(agg, Aggregate), name,
                   f"returned {describe(agg)} as the aggregate; expected an Aggregate", t)
            if agg.delta_mean is not given.delta_mean:
                agg = dataclasses.replace(agg, delta_mean=returned_vector(
                    agg.delta_mean, state.x, name, "its aggregate's delta_mean", t))
            slots[i] = kept_slot(slots[i], slot, name, t)
            _add_metrics(metrics, owners, returned_metrics(m, name, t), name, t)
            expect(agg.weight_sum is given.weight_sum or agg.count == 0
                   or float(agg.weight_sum) > 0, name,
                   f"returned an aggregate of {agg.count} updates whose weight_sum is "
                   f"{float(agg.weight_sum):g}; expected > 0 (the weights of its updates)", t)
            aggregates.add(name, agg)
        aggregates.check(t)
        if agg.restart_server_opt:  # a layer's request; the slot is the stack's to write
            name = name_of(self.optimizer.reset or self.optimizer.init)
            with calling(name, round=t):
                srv.opt_state = checkpointable(self.optimizer.restart(state.x), name,
                                               "a server optimiser state", t)
        name = name_of(self.algorithm, "server_update")
        lent = Lent().add("x", state.x).add("state", state.algorithm).add("agg", agg)
        with calling(name, round=t):
            out = self.algorithm.server_update(state.x, state.algorithm, agg, srv)
        lent.check(name, t)  # the round's model, state and sums: read, never edited in place
        x, own, m = returned(out, ("x", "state", "metrics"), name, t)
        x = returned_vector(x, state.x, name, "its x", t)
        _add_metrics(metrics, owners, {**returned_metrics(m, name, t), **srv.metrics}, name,
                     t)  # its metrics and its server optimiser's
        models = Trail("an x", x)
        for i, layer in enumerate(self.layers):
            srv.deployed = self._deployed(x, own, slots[:i], t)
            name = self.name(i, "after")
            with calling(name, round=t):
                out = layer.after(slots[i], x, srv)
            x, slot, m = returned(out, ("x", "slot", "metrics"), name, t)
            x = returned_vector(x, state.x, name, "its x", t)
            slots[i] = kept_slot(slots[i], slot, name, t)
            _add_metrics(metrics, owners, returned_metrics(m, name, t), name, t)
            models.add(name, x)
        models.check(t)
        wrappers, transforms = self._split(slots)
        buffers = agg.buffers_mean if agg.buffers_mean is not None else state.buffers
        return ServerState(x, own, srv.opt_state, wrappers, transforms, buffers), agg, metrics

    def check_reports(self, algorithm_keys, sums: tuple, t: int | None) -> None:
        """Under a layer that privatises the upload (DP), refuse every report a client sent
        beside it that the layer does not account for: the algorithm's payload keys and every
        other layer's, but for those declared public (a ComponentError naming the sender)."""
        guard = self.privatiser
        if guard is None:
            return
        sent = [(name_of(self.algorithm, "client_train"), key) for key in algorithm_keys]
        sent += [(self.client_half(i), key)
                 for i, (layer, own) in enumerate(zip(self.layers, sums)) if layer is not guard
                 for key in own if key not in layer.traits.public_reports]
        guard.check_reports(sent, t)

    def check_payload(self, summed: list[str], rows: list[str], uploaded, sums: tuple,
                      t: int | None) -> None:
        """Refuse what the algorithm sent (its ``summed`` and ``rows`` payload keys, of which
        ``uploaded`` came as Upload entries) that its layers cannot carry or account for:
        :meth:`check_uploads`, then :meth:`check_reports` of everything but the summed Upload
        entries (a privatising layer noises those)."""
        self.check_uploads(uploaded, [k for k in rows if k in uploaded], t)
        self.check_reports([k for k in summed if k not in uploaded] + list(rows), sums, t)

    def check_uploads(self, uploaded, rows: list[str], t: int | None) -> None:
        """Refuse the algorithm's :class:`~rayfl.algorithms.base.Upload` entries a layer cannot
        carry (a ComponentError naming ``client_train``): any, beside a layer whose traits say
        why (a robust rule: it replaces the mean of the uploads only); those collected row by
        row (``rows``), beside a layer that hides or privatises all but the sum (SecAgg, DP)."""
        for i, layer in enumerate(self.layers):
            own = layer.traits
            refused, why = uploaded, own.uploads or (
                "it replaces the round's mean update by a statistic of the model's uploads and "
                "would sum these unprotected" if own.needs_updates else None)
            if why is None and (own.transport or own.privatises) and not own.upload_sums:
                why = ("it privatises or transports the update's sum and does not say it does "
                       "the same to the Upload entries' (LayerTraits.upload_sums)")
            if why is None and (own.transport or own.privatises):
                refused, why = rows, ("the server reads an Upload(rows=True) entry client by "
                                      "client, and this layer reveals only the round's sum")
            if why and refused:
                raise ComponentError(name_of(self.algorithm, "client_train"),
                                     f"sent {', '.join(map(repr, refused))} as Upload payload "
                                     f"beside {self.name(i, 'aggregate')}: {why}", t)

    def deployed(self, state: ServerState, t: int | None = None) -> Vec:
        """The model evaluated, reported and saved (after round ``t``, named in an error)."""
        return self._deployed(state.x, state.algorithm, self._slots(state), t)

    def _deployed(self, x: Vec, own: Any, slots: list, t: int | None = None) -> Vec:
        """The model deployed by the algorithm and the first ``len(slots)`` layers."""
        return self._deployments(x, own, slots, t)[-1]

    def _deployments(self, x: Vec, own: Any, slots: list, t: int | None) -> list[Vec]:
        """The model the algorithm deploys from ``x``, then what each of the first
        ``len(slots)`` layers deploys of the one before, each checked."""
        models, trail = [x], Trail("a deployed model", x)
        for name, call in \
                [(name_of(self.algorithm, "deployed"), lambda x: self.algorithm.deployed(x, own))] \
                + [(self.name(i, "deployed"), lambda x, layer=layer, slot=slot:
                    layer.deployed(slot, x)) for i, (layer, slot) in enumerate(zip(self.layers,
                                                                                   slots))]:
            with calling(name, round=t):
                models.append(returned_vector(call(models[-1]), x, name, "the deployed model",
                                              t))
            trail.add(name, models[-1])
        trail.check(t)
        return models[1:]

    def extra_models(self, state: ServerState, t: int | None = None) -> dict[str, Vec]:
        """Further models worth evaluating each evaluation round (after round ``t``), by
        metric prefix."""
        algo, out, slots = self.algorithm, {}, self._slots(state)
        if algo.traits.has("extra_models"):
            out.update(self._extra(name_of(algo, "extra_models"),
                                   lambda: algo.extra_models(state.x, state.algorithm),
                                   state.x, t))
        deployed = self._deployments(state.x, state.algorithm, slots, t)  # under each layer
        for i, (layer, slot, x) in enumerate(zip(self.layers, slots, deployed)):
            out.update(self._extra(self.name(i, "extra_models"), lambda layer=layer, slot=slot,
                                   x=x: layer.extra_models(slot, x), state.x, t))
        return out

    def payload_sums(self, sums: tuple, t: int | None = None) -> None:
        """Each layer's payload sums of round ``t`` checked (ComponentError naming its client
        half)."""
        for i, own in enumerate(sums):
            _payload_sums(self.client_half(i), own, t)

    @staticmethod
    def _extra(name: str, call: Callable[[], Any], like: Vec, t: int | None
               ) -> dict[str, Vec]:
        """A component's further models (``name``: its ``extra_models``), checked: a dict of
        names to vectors shaped like x, finite where x is."""
        with calling(name, round=t):
            out = call()
        expect(isinstance(out, dict), name,
               f"returned {describe(out)}; expected a dict of name -> model vector", t)
        for k, v in out.items():
            returned_vector(v, like, name, f"its model {k!r}", t)
            no_new_non_finite([like, v], [name], f"its model {k!r}", t)
        return out

    def upload_bytes(self, numel: int, element_size: int = 4) -> float:
        """Bytes one client uploads for a ``numel``-parameter update (dense: numel × size)."""
        size = float(numel * element_size)
        for layer in self.layers:
            size = layer.upload_bytes(numel, size)
        return size

    def from_legacy(self, flat: dict, transforms: list | None, buffers: Vec | None
                    ) -> ServerState:
        """The tree of a rayfl 0.1 checkpoint: one flat dict held x, the algorithm's entries,
        the server optimiser's (m, v) and the wrappers' own; a list the transforms' states."""
        fresh = self.init(flat["x"], buffers)
        opt = {k: flat[k] for k in (fresh.server_opt or {}) if k in flat}
        wrappers = tuple(w.from_legacy(flat) for w in self.wrappers)
        old = list(transforms or [])
        transforms = tuple(t.from_legacy(old[i] if i < len(old) else {})
                           for i, t in enumerate(self.transforms))
        return ServerState(flat["x"], legacy_slot(fresh.algorithm, flat), opt or
                           fresh.server_opt, wrappers, transforms, buffers)

    def fork(self, state: ServerState, next_round: int, source: "Stack") -> ServerState:
        """The state a run forked from ``source``'s checkpoint ``state`` continues with (ValueError
        saying why when it cannot): the same tree, each layer's own fork rule applied."""
        fresh = self.init(state.x, state.buffers)
        if len(source.layers) == len(self.layers) and [type(a) for a in source.layers] == \
                [type(b) for b in self.layers]:
            slots = [layer.fork(slot, next_round, src) for layer, slot, src
                     in zip(self.layers, self._slots(state), source.layers)]
            state = dataclasses.replace(state, **dict(zip(("wrappers", "transforms"),
                                                          self._split(slots))))
        else:  # other layers: each keeps its slot only where it forks from the same layer
            slots = []
            by_type = {type(layer): (layer, slot) for layer, slot
                       in zip(source.layers, source._slots(state))}
            for layer, new in zip(self.layers, self._slots(fresh)):
                src, slot = by_type.get(type(layer), (None, new))
                slots.append(layer.fork(slot, next_round, src) if src is not None else
                             layer.fork(new, next_round, layer))
            state = dataclasses.replace(state, **dict(zip(("wrappers", "transforms"),
                                                          self._split(slots))))
        problem = mismatch(fresh, state)
        if problem:
            raise ValueError(f"a server state shaped like this run's ({problem}: another "
                             "algorithm or server optimiser)")
        return state
