"""The algorithm interface: six methods over flat vectors, a typed state, one record of traits.

An algorithm is math, not plumbing. It sees flat parameter vectors (``torch.Tensor`` of shape
``(d,)``) and its own state; it never sees Ray, actors, files, other layers or models. It is the
innermost layer of a run's stack (:mod:`rayfl.layers`): server wrappers and aggregation
transforms sit around it, each with its own slot of the state. Each round ``t`` the round loop
(``rayfl/runtime/loop.py``):

1. :meth:`Algorithm.broadcast` — what every sampled client receives from the server model ``x``
   and the algorithm's own server state (``bc["x"]`` is where local training starts);
   :meth:`Algorithm.aggregation_weights` — each sampled client's weight p_i;
2. :meth:`Algorithm.client_train` — one client's local training, wherever an executor runs it,
   over a :class:`~rayfl.runtime.context.LocalContext` (the model as a function of a flat
   vector, the seeded minibatches, the local optimiser; ``ctx.train(rule)`` runs the fast
   flat-vector loop under a :class:`LocalRule`): it returns a :class:`ClientResult` — the final
   local model, what the client uploads (Δ_i = x − y_i unless it says otherwise), a payload
   summed over clients and its new persistent state;
3. the layers around it see and may change each upload (clipping, compression, DP, attacks);
4. :meth:`Algorithm.server_update` — the new model and state from the round's
   :class:`Aggregate`, stepping the server optimiser through ``srv.step(direction)``;
5. :meth:`Algorithm.deployed` — the model evaluated, reported and saved.

:meth:`Algorithm.server_init` gives the algorithm's own server state: a frozen dataclass (its
``State``), or None when it keeps none; checkpoints, resume and fork store and check it by its
structure. What the algorithm is and what it refuses is one :class:`Traits` record, read by the
compatibility rules (:mod:`rayfl.compat`). Every payload value is *summed* over the round's
completed clients (or collected row by row: :class:`Rows`; an :class:`Upload` entry is part of
the upload, seen by every layer): an algorithm that wants a weighted mean multiplies by
``task.weight`` and divides by ``agg.weight_sum``.

A few methods exist for the algorithms that need them, each declared in the traits
(``capabilities``): ``extra_models(x, state)`` (further models to evaluate),
``personal_model(state, x, group, buffers)`` (a personalised method's model of one client and
its buffers, scored by the per-client evaluation), ``client_setup(x, y)`` /
``server_setup(state, ids, summaries)`` (a one-off per-client summary before round 0: fedmsi's
similarity graph) and
``round_message(x, state, agg, t)`` / ``client_settle(state, message)`` (a client-state update
that needs the round's aggregate, applied when the client next takes part: ProxSkip).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Mapping

import torch

from rayfl import schema
from rayfl.algorithms import server_opt as opt
from rayfl.contract import (Lent, calling, describe, expect, name_of, no_new_non_finite, returned,
                            returned_metrics, returned_vector)
from rayfl.runtime.checkpoint_file import unencodable_tree

Vec = torch.Tensor

#: what a ``client_state`` entry may be declared as (see :class:`Traits`)
STATE_KINDS = ("model", "scalar", "buffers", "any")
#: the optional capabilities an algorithm may declare (``Traits.capabilities``), and the
#: methods each one means it defines
CAPABILITIES = MappingProxyType({
    "extra_models": ("extra_models",),
    "personal_model": ("personal_model",),
    "setup": ("client_setup", "server_setup"),
    "settle": ("round_message", "client_settle"),
})


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Traits:
    """What an algorithm is, what it needs and what it refuses (with the reason), in one record.

    Refusals are reasons: None accepts the combination, a string refuses it and is the reason
    the one-line error gives. The compatibility rules (:mod:`rayfl.compat`) read this record; a
    subclass derives its own with ``dataclasses.replace(Parent.traits, ...)``.
    """

    #: what ``aggregation.weighting: auto`` means (its paper's choice)
    weighting: str = "samples"
    #: ``aggregation.weighting`` values besides samples / uniform that the algorithm defines
    weightings: tuple[str, ...] = ()
    #: the client's persistent state, typed: entry -> "model" (a vector shaped like x),
    #: "scalar" (a one-element tensor), "buffers" (the model's buffers, None without) or "any"
    #: (a tensor of any shape);
    #: every state a client returns is checked against it; empty: it keeps none
    client_state: Mapping[str, str] = field(default_factory=dict)
    #: its server step is x ← x − opt(D), so it takes any server optimiser (``server_opt``)
    server_opt: bool = False
    #: its server update reads only what DP-FedAvg noises (Δ̄, the update's sum, the sums of
    #: its Upload entries), so it is post-processing of the mechanism's release
    dp_post_processing: bool = False
    #: model buffers (BatchNorm statistics): each client keeps its own in its state (FedBN);
    #: False: clients start from the server's mean of the last round's client buffers
    local_buffers: bool = False
    #: the optional methods it defines (keys of :data:`CAPABILITIES`)
    capabilities: frozenset[str] = frozenset()
    #: why FedBuff / FedAsync are refused (None: its math holds when clients start from
    #: different past models and the server applies them as they arrive)
    asynchronous: str | None = "its math assumes synchronous rounds"
    #: why models with buffers are refused
    buffers: str | None = None
    #: why averaging its server models over rounds (IMA) is undefined for it
    averaging: str | None = None
    #: why Adam as the local optimiser is refused
    adam: str | None = None
    #: why local momentum is refused (Adam is then refused too)
    local_momentum: str | None = None
    #: why any local optimiser setting beyond plain SGD (momentum, weight decay, clipping, Adam)
    #: is refused: it takes plain steps of its own
    plain_sgd: str | None = None
    #: the tuner's preset: dotted run-config key -> parameter spec (``rayfl tune``)
    search_space: Mapping[str, Mapping] = field(default_factory=dict)
    #: local optimiser settings ``rayfl compare`` resets to plain SGD for it, at the same
    #: effective step size lr / (1 − momentum) (its own step replaces local momentum)
    compare_plain: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "client_state", _frozen(self.client_state))
        object.__setattr__(self, "search_space", _frozen(self.search_space))
        object.__setattr__(self, "capabilities", frozenset(self.capabilities))

    def has(self, capability: str) -> bool:
        """Whether the algorithm declares the optional ``capability``."""
        return capability in self.capabilities


@dataclass(frozen=True)
class ServerParams:
    """Hyper-parameters every algorithm has: the server learning rate η_g."""

    server_lr: float = schema.field(1.0, doc="server learning rate η_g", lo=0.0, lo_open=True)


class LocalRule:
    """How one client's local step differs from plain SGD, fixed for the round: the fast
    flat-vector loop ``ctx.train(rule)`` computes ``g = ∇f_i(rule.grad_point(y))`` (plus weight
    decay at ``y``) and feeds ``rule.direction(g, y, lr)`` to the local optimiser
    (``y ← y − η_l · direction`` for plain SGD)."""

    def grad_point(self, y: Vec) -> Vec:
        """Where to evaluate the stochastic gradient (default: the iterate itself)."""
        return y

    def direction(self, g: Vec, y: Vec, lr: float) -> Vec:
        """The corrected descent direction (default: the gradient)."""
        return g


PLAIN_SGD = LocalRule()


@dataclass(frozen=True)
class ClientTask:
    """One client's round as the algorithm sees it: who, when, how fast, from where, with what."""

    client_id: int
    t: int  # the round (0-based)
    lr: float  # η_l of the round
    weight: float  # un-normalised aggregation weight p_i
    bc: dict[str, Vec]  # the algorithm's broadcast; bc["x"] is where local training starts
    state: dict[str, Any] | None  # the client's persistent state (None: it never trained)
    num_steps: int | None = None  # K_i: the local steps of this round (None: not known)


@dataclass(frozen=True)
class Rows:
    """A payload entry collected client by client instead of summed (the server reads every
    client's row: fedmsi keeps the round's final local models). In the :class:`Aggregate` it
    is the :class:`Collected` rows of the clients that completed."""

    value: Vec


@dataclass(frozen=True)
class Upload:
    """A payload entry the client uploads with its update, so that every layer treats it as
    part of the upload: each client half sees one vector ``[Δ_i, value.flatten()]`` (clipped,
    compressed, error-fed back, masked together), then the entry is summed over the round and
    the server halves act on its sum too (DP's noise at the same σ, SecAgg's decode); the
    algorithm reads it as ``agg.extras[key]``, shaped as sent. IFCA's per-cluster sums are one.
    With ``rows=True`` it is collected client by client (:class:`Collected`, as :class:`Rows`
    are), which DP and SecAgg refuse: they reveal only sums."""

    value: Vec
    rows: bool = False


@dataclass(frozen=True)
class Collected:
    """A :class:`Rows` payload entry over the round: ``rows[k]`` is client ``ids[k]``'s."""

    ids: list[int]
    rows: Vec


@dataclass
class ClientResult:
    """What one client hands back: its final local model ``y_i``, its payload (summed over the
    round's clients, or :class:`Rows`), its new persistent state (None: it keeps none) and what
    it uploads (None: Δ_i = x − y_i; every layer, metric and rule sees the upload)."""

    model: Vec
    payload: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    upload: Vec | None = None


@dataclass
class Aggregate:
    """The round's sums over completed clients, plus what the runtime derives from them.

    ``delta_mean`` is Δ̄ = Σ w_i Δ_i / Σ w_i of the uploads Δ_i (by default x_start − y_i).
    ``extras`` holds the algorithm's own payload sums (:class:`Collected` for :class:`Rows`).
    """

    count: int  # |S_t| clients that completed
    num_sampled: int  # clients dispatched (completed + dropped)
    num_clients: int  # N registered clients
    weight_sum: float
    delta_mean: Vec  # Δ̄ (weighted)
    delta_sum: Vec  # Σ Δ_i (unweighted)
    delta_sq_sum: float  # Σ ‖Δ_i‖²
    extras: dict[str, Any]
    #: Σ w_i b_i / Σ w_i of the clients' model buffers after training (None: no buffers)
    buffers_mean: Vec | None = None
    #: every completed client's Δ_i as sent (rows in completion order), only when a layer reads
    #: them all (robust aggregation); None otherwise
    updates: Vec | None = None
    #: set by a layer on the way in: the server optimiser's slot starts afresh from this
    #: round's x before the update (IMA zeroes FedAdam's moments at t_s)
    restart_server_opt: bool = False
    #: the ``extras`` keys the clients sent as :class:`Upload` entries (the layers saw them),
    #: in order
    uploaded: tuple[str, ...] = ()


class ServerRound:
    """What a server update may use besides its own state: the round ``t``, the registered
    clients ``num_clients`` and the server optimiser, stepped by :meth:`step`. The optimiser's
    state is a slot of the run's state that no layer writes: the stack lends it here for the
    round and takes the stepped state back as the slot's value (a layer that needs it restarted
    says so with ``Aggregate.restart_server_opt``)."""

    def __init__(self, t: int, x: Vec, num_clients: int, optimizer: opt.ServerOpt,
                 opt_state: Any):
        self.t, self.x, self.num_clients = t, x, num_clients
        self.optimizer, self.opt_state = optimizer, opt_state
        self.metrics: dict[str, float] = {}
        #: in a layer's ``after``: the model deployed by everything under it after the update
        self.deployed: Vec | None = None

    @property
    def adaptive(self) -> bool:
        """Whether the server optimiser has per-coordinate step sizes (FedAdam, FedYogi)."""
        return self.optimizer.adaptive

    def step(self, direction: Vec, x: Vec | None = None) -> Vec:
        """x − opt(direction) (x: the round's model unless given); the optimiser's state and
        metrics are updated."""
        name = name_of(self.optimizer.update)
        start = self.x if x is None else x
        lent = Lent().add("its direction", direction)  # often the aggregate itself
        with calling(name, round=self.t):
            if self.optimizer.sees_x:
                lent.add("x", start)
                out = self.optimizer.update(direction, self.opt_state, start)
            else:
                out = self.optimizer.update(direction, self.opt_state)
        lent.check(name, self.t)
        step, self.opt_state, metrics = returned(out, ("step", "state", "metrics"), name,
                                                 self.t)
        step = returned_vector(step, direction, name, "its step", self.t)
        no_new_non_finite([direction, step], [name], "a step", self.t)
        self.metrics = returned_metrics(metrics, name, self.t)
        found = unencodable_tree(self.opt_state)
        expect(found is None, name, f"returned a state holding {found}, which a checkpoint "
                                    "cannot hold (tensors, arrays, numbers, strings, lists, "
                                    "dicts and dataclasses of them)", self.t)
        return start - step


class Algorithm:
    """Base class; subclasses override what their paper changes. Defaults are FedAvg's."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = ServerParams
    traits: ClassVar[Traits] = Traits()

    def __init__(self, params: Any = None, *, weighting: str = "samples", num_clients: int = 1,
                 local_momentum: float = 0.0):
        self.p = params if params is not None else self.Params()
        self.server_lr = getattr(self.p, "server_lr", 1.0)  # a Params may omit η_g
        self.weighting = weighting
        self.num_clients = num_clients
        self.local_momentum = local_momentum  # ρ of local heavy-ball SGD (0: plain SGD)

    def default_server_opt(self) -> opt.ServerOpt:
        """The server optimiser without a ``server_opt`` section: SGD with lr η_g (FedAvgM,
        FedAdam, ... fix their own)."""
        return opt.sgd(self.server_lr)

    def effective_steps(self, steps: int) -> float:
        """‖a_i‖₁: the total weight ``steps`` local directions receive under momentum ρ.

        Heavy-ball SGD (buf ← ρ buf + d; y ← y − η_l buf) moves y by η_l Σ_j a_j d_j with
        a_j = (1 − ρ^{K−j+1}) / (1 − ρ), so ‖a‖₁ = [K − ρ (1 − ρ^K) / (1 − ρ)] / (1 − ρ); it is K
        for plain SGD. (x_t − y) / (η_l ‖a‖₁) is then the a-weighted mean local direction, the
        quantity SCAFFOLD's option II and FedNova's d_i estimate.
        """
        rho = self.local_momentum
        if rho == 0.0:
            return float(steps)
        return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)

    @classmethod
    def check_config(cls, params: Any, cfg: Any, where: str) -> None:
        """Rules on its own hyper-parameters (keys ``{where}.KEY``) that involve other sections
        (raise ConfigError); what its traits say is checked by :mod:`rayfl.compat`."""

    @classmethod
    def check_model(cls, params: Any, layout: Any, handle: Any) -> None:
        """Rules that tie the algorithm to the model's parameter groups (``layout``: its
        :class:`~rayfl.models.flat.Layout`) and to the data behind ``handle``, checked before
        anything starts (raise ConfigError)."""

    # ----- the six methods -------------------------------------------------------------------
    def server_init(self, x0: Vec) -> Any:
        """The algorithm's own server state beside the model x_0 (a frozen dataclass; None:
        it keeps none)."""
        return None

    def broadcast(self, x: Vec, state: Any, t: int) -> dict[str, Vec]:
        """What every sampled client of round t receives; ``"x"`` is where training starts."""
        return {"x": x}

    def aggregation_weights(self, state: Any, client_ids, num_samples) -> list[float]:
        """Un-normalised aggregation weights p_i for the sampled clients."""
        if self.weighting == "uniform":
            return [1.0] * len(client_ids)
        return [float(n) for n in num_samples]

    def client_train(self, task: ClientTask, ctx: Any) -> ClientResult:
        """One client's local training (FedAvg: plain local SGD from ``task.bc["x"]``)."""
        return ClientResult(ctx.train())

    def server_update(self, x: Vec, state: Any, agg: Aggregate,
                      srv: ServerRound) -> tuple[Vec, Any, dict]:
        """FedAvg: x ← x − opt(Δ̄). Returns the new model, the new state and its metrics."""
        if agg.count == 0:
            return x, state, {}
        return srv.step(agg.delta_mean), state, {}

    def deployed(self, x: Vec, state: Any) -> Vec:
        """The model that is evaluated and reported (and saved as the final model)."""
        return x


def check_client_state(algorithm: Algorithm, state: dict, dim: int) -> str | None:
    """What is wrong with a client's returned ``state`` against the algorithm's declaration
    (``dim``: the model's parameter count), or None: an entry it does not declare, or one of
    another shape than declared."""
    if not isinstance(state, dict):
        return f"returned a state that is {_shape(state)}, not a dict of declared entries"
    declared = algorithm.traits.client_state
    for key, value in state.items():
        kind = declared.get(key)
        numel = value.numel() if isinstance(value, torch.Tensor) else None
        if kind is None:
            problem = f"is not declared (traits.client_state: {dict(declared)})"
        elif kind == "model" and (numel != dim or value.dim() != 1):
            problem = f"is declared 'model' but is {_shape(value)}, not a vector of {dim}"
        elif kind == "scalar" and numel != 1:
            problem = f"is declared 'scalar' but is {_shape(value)}, not a one-element tensor"
        elif kind == "buffers" and value is not None and (numel is None or value.dim() != 1):
            problem = f"is declared 'buffers' but is {_shape(value)}, not a flat vector or None"
        elif kind == "any" and numel is None:
            problem = (f"is declared 'any' but is {describe(value)}, not a tensor (of any "
                       "shape: a client's state file holds tensors; torch.as_tensor(...) it)")
        else:
            continue
        return f"client state entry {key!r} {problem}"
    return None


def declaration_problem(cls: type) -> str | None:
    """What is wrong with what an algorithm class declares of itself (its traits record, the
    kinds of its client-state entries, its capabilities and the methods each one means), or
    None; said where the run is configured, before anything starts."""
    traits = cls.traits
    if not isinstance(traits, Traits):
        return (f"an algorithm whose traits is a Traits record (dataclasses.replace(Parent."
                f"traits, ...) or rayfl.algorithms.base.Traits(...)); its traits is "
                f"{describe(traits)}")
    for key, kind in traits.client_state.items():
        if kind not in STATE_KINDS:
            return (f"an algorithm whose traits.client_state kinds are one of "
                    f"{', '.join(STATE_KINDS)} (entry {key!r} is {kind!r})")
    unknown = sorted(map(repr, traits.capabilities - set(CAPABILITIES)))
    if unknown:
        return (f"an algorithm whose traits.capabilities are among {', '.join(CAPABILITIES)} "
                f"(it declares {', '.join(unknown)})")
    for capability in sorted(traits.capabilities):
        missing = [m for m in CAPABILITIES[capability] if not callable(getattr(cls, m, None))]
        if missing:
            return (f"an algorithm that defines {' and '.join(CAPABILITIES[capability])}, "
                    f"as its capability {capability!r} means (it has no {missing[0]})")
    return built_as(cls, "an algorithm", "cls(params, *, weighting, num_clients, "
                    "local_momentum)", None, weighting="samples", num_clients=1,
                    local_momentum=0.0)


def built_as(cls: type, what: str, call: str, *args: Any, **kwargs: Any) -> str | None:
    """Why ``cls(*args, **kwargs)``, the call rayfl builds ``what`` with (``call`` in words),
    does not fit the class's ``__init__`` (None: it fits)."""
    try:
        inspect.signature(cls).bind(*args, **kwargs)
    except TypeError as e:
        return f"{what} built as {call} (its __init__ does not take that: {e})"
    except ValueError:  # no signature to read: the call itself will tell
        pass
    return None


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def params_of(cls: type[Algorithm]) -> list[dataclasses.Field]:
    """The hyper-parameter fields of an algorithm (for docs and the tuner)."""
    return list(dataclasses.fields(cls.Params))
