"""The algorithm interface: client step, client state, server state and server update on flat vectors.

An algorithm is math, not plumbing. It sees flat parameter vectors (``torch.Tensor`` of shape
``(d,)``) and small dicts of them; it never sees Ray, actors, files or models. The round loop
(``rayfl/runtime/loop.py``):

1. calls :meth:`Algorithm.server_init` once with the initial model ``x_0``;
2. each round ``t`` calls :meth:`broadcast` (what every sampled client receives; ``bc["x"]`` is
   the point local training starts from) and :meth:`aggregation_weights`;
3. for each sampled client, wherever the executor runs it, one of two ways of writing a client:

   - the flat-vector rule (the fast path for step corrections: SCAFFOLD, FedDyn, FedProx):
     :meth:`client_begin` gives a :class:`LocalRule` (where to take the gradient, how to correct
     it), the local optimizer runs ``K_i`` steps, then :meth:`client_end` returns the client's
     payload (summed across clients) and its new persistent state;
   - a client procedure (capability ``client_train(task, ctx) -> (y, ClientResult)``): the
     algorithm runs the local loop itself over a
     :class:`~rayfl.runtime.context.LocalContext` — the model as a function of a flat vector
     (loss and gradient at any point, logits and named features), the seeded minibatches, the
     local optimiser, parameter groups — and returns its final model ``y`` (Δ_i = x − y is
     summed as usual) with its payload and new state, which may hold whole models.

   Both see the client's round as one :class:`ClientTask`;
4. calls :meth:`server_update` with the :class:`Aggregate` of all payloads.

Every payload value is *summed* over the round's completed clients: an algorithm that wants a
weighted mean multiplies by ``task.weight`` in :meth:`client_end` and divides by
``agg.weight_sum`` in :meth:`server_update`.

Optional capabilities (methods an algorithm defines only when it needs them; the loop looks
for them by name, see :func:`has`):

- ``client_train(task, ctx) -> (y, ClientResult)``: a client procedure (above);
- ``round_message(state, agg, t) -> dict`` and ``client_settle(state, message) -> state``: a
  client-state update that needs the round's aggregate (ProxSkip's h_i update needs x_{t+1}):
  after round t's server update the server computes the round's message, and every client
  that trained in round t has ``client_settle`` applied to its state, with that message, when
  it next takes part (before ``client_begin``/``client_train``) — exact under partial
  participation, whatever happened in between (:mod:`rayfl.runtime.messages`);
- ``client_setup(x, y) -> Vec`` and ``server_setup(state, client_ids, summaries) -> State``: a
  one-off per-client summary sent before round 0 (fedmsi's similarity graph);
- ``receive_client_models(state, client_ids, models) -> State``: the round's final local models
  (rows in ``client_ids`` order), before :meth:`server_update` (fedmsi's anchors);
- ``personal_model(state, x, group) -> (Vec, buffers or None)``: a personalised method's model
  of one client from its persistent state (None: it never trained), the global model ``x`` and
  ``group(name)``, the boolean mask of a parameter group; the per-client evaluation
  (``eval.clients``) scores it in the ``personal_*`` columns beside the global model's (Ditto's
  v_k, FedPer's own head on the global body).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rayfl import schema
from rayfl.algorithms import server_opt as opt

Vec = torch.Tensor
State = dict[str, Any]

#: the reserved broadcast / client-state entry holding model buffers (BatchNorm statistics)
BUFFERS = "_model_buffers"

#: the optional capabilities an algorithm may define (see the module docstring)
CAPABILITIES = ("client_train", "round_message", "client_settle", "client_setup",
                "server_setup", "receive_client_models", "personal_model")


def has(algorithm: Any, capability: str) -> bool:
    """Whether ``algorithm`` defines the optional ``capability`` (one of :data:`CAPABILITIES`)."""
    return callable(getattr(algorithm, capability, None))


@dataclass(frozen=True)
class ServerParams:
    """Hyper-parameters every algorithm has: the server learning rate η_g."""

    server_lr: float = schema.field(1.0, doc="server learning rate η_g", lo=0.0, lo_open=True)


class LocalRule:
    """How one client's local step differs from plain SGD, fixed for the round.

    The runtime computes ``g = ∇f_i(grad_point(y))`` (plus weight decay at ``y``), then feeds
    ``direction(g, y)`` to the local optimizer (``y ← y − η_l · direction`` for plain SGD).
    """

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
    bc: dict[str, Vec]  # the round's broadcast; bc["x"] is where local training starts
    state: dict[str, Vec] | None  # the client's persistent state (None: it never trained)
    num_steps: int | None = None  # K_i: the local steps of this round (None: not known)


@dataclass
class ClientResult:
    """What one client hands back: payload to sum, new persistent state (None: keep none)."""

    payload: dict[str, Any]
    state: dict[str, Vec] | None


@dataclass
class Aggregate:
    """The round's sums over completed clients, plus what the runtime derives from them.

    ``delta_mean`` is Δ̄ = Σ w_i Δ_i / Σ w_i with Δ_i = x_start − y_i (start minus end).
    ``extras`` holds the algorithm's own payload sums.
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
    #: every completed client's Δ_i as sent (rows in completion order), only when a server
    #: step needs them all (robust aggregation); None otherwise
    updates: Vec | None = None


class Algorithm:
    """Base class; subclasses override what their paper changes. Defaults are FedAvg's."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = ServerParams
    #: what ``aggregation.weighting: auto`` means for this algorithm (its paper's choice)
    paper_weighting: ClassVar[str] = "samples"
    #: ``aggregation.weighting`` values besides samples / uniform that the algorithm defines
    extra_weightings: ClassVar[tuple[str, ...]] = ()
    #: the client's persistent state, typed: entry -> "model" (a vector shaped like x),
    #: "scalar" (a one-element tensor), "buffers" (the model's buffers, None without) or "any" (a shape
    #: of its own: a parameter group, a history); every state a client returns is checked
    #: against it (:func:`check_client_state`); empty: the algorithm keeps no client state
    client_state: ClassVar[dict[str, str]] = {}
    #: the server step is x ← x − opt(D) for a server optimizer ``opt`` (``server_opt`` config)
    accepts_server_opt: ClassVar[bool] = False
    #: the server update reads only Δ̄ (no per-client payload or second moments), so it is
    #: post-processing of DP-FedAvg's noised mean (``privacy`` section)
    dp_post_processing: ClassVar[bool] = False
    #: the math holds when clients start from different past models and the server applies
    #: them as they arrive (``aggregation.mode`` fedbuff/fedasync): stateless clients and a
    #: server update that reads only Δ̄
    asynchronous_ok: ClassVar[bool] = False
    #: why ``aggregation.mode`` fedbuff/fedasync is refused (when ``asynchronous_ok`` is False)
    synchronous_reason: ClassVar[str] = "its math assumes synchronous rounds"
    #: model buffers (BatchNorm statistics) of a client's model: False — every client starts
    #: from the server's weighted mean of the last round's client buffers; True — each client
    #: keeps its own in its state (FedBN), and the mean serves only the global model's
    #: evaluation
    local_buffers: ClassVar[bool] = False
    #: why models with buffers are refused (None: accepted)
    buffers_reason: ClassVar[str | None] = None
    #: why averaging its server models over rounds (IMA) is undefined for it (None: it is not)
    averaging_reason: ClassVar[str | None] = None

    def __init__(self, params: Any = None, *, weighting: str = "samples", num_clients: int = 1,
                 local_momentum: float = 0.0, server_opt: opt.ServerOpt | None = None):
        self.p = params if params is not None else self.Params()
        self.server_lr = getattr(self.p, "server_lr", 1.0)  # a Params may omit η_g
        self.weighting = weighting
        self.num_clients = num_clients
        self.local_momentum = local_momentum  # ρ of local heavy-ball SGD (0: plain SGD)
        self.server_opt = server_opt if server_opt is not None else self.default_server_opt()

    def default_server_opt(self) -> opt.ServerOpt:
        """The server optimizer without a ``server_opt`` config: SGD with lr η_g."""
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
    def check_config(cls, params: Any, cfg: Any) -> None:
        """Rules that tie the algorithm to other config sections (raise ConfigError)."""

    @classmethod
    def check_model(cls, params: Any, layout: Any, handle: Any) -> None:
        """Rules that tie the algorithm to the model's parameter groups (``layout``: its
        :class:`~rayfl.models.flat.Layout`) and to the data behind ``handle``, checked before
        anything starts (raise ConfigError)."""

    @classmethod
    def is_preset(cls) -> bool:
        """Whether the class fixes its own server optimizer (FedAvgM, FedAdam, ...)."""
        return cls.default_server_opt is not Algorithm.default_server_opt

    # ----- server side -------------------------------------------------------------------
    def server_init(self, x0: Vec) -> State:
        """Initial server state; ``state["x"]`` is the global model x_0."""
        return {"x": x0.clone(), **self.server_opt.init(x0)}

    def broadcast(self, state: State, t: int) -> dict[str, Vec]:
        """What every sampled client of round t receives; ``"x"`` is where training starts."""
        return {"x": state["x"]}

    def local_lr(self, t: int, lr0: float, decay: float) -> float:
        """Client learning rate of round t (η_l(t) = η_0 · decay^t by default)."""
        return lr0 * decay**t

    def aggregation_weights(self, state: State, client_ids, num_samples) -> list[float]:
        """Un-normalised aggregation weights p_i for the sampled clients."""
        if self.weighting == "uniform":
            return [1.0] * len(client_ids)
        return [float(n) for n in num_samples]

    def server_step(self, state: State, direction: Vec) -> tuple[State, dict]:
        """``state`` after x ← x − opt(direction) (the server optimizer's state updated too)."""
        step, opt_state, metrics = self.server_opt.update(direction, state)
        return {**state, **opt_state, "x": state["x"] - step}, metrics

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        """FedAvg: x ← x − opt(Δ̄). Returns the new state and the algorithm's own metrics."""
        if agg.count == 0:
            return dict(state), {}
        return self.server_step(state, agg.delta_mean)

    def deployed(self, state: State) -> Vec:
        """The model that is evaluated and reported (and saved as the final model)."""
        return state["x"]

    def extra_models(self, state: State) -> dict[str, Vec]:
        """Further models worth evaluating each eval round, by metric prefix (e.g. AdaBest's x_{t+1})."""
        return {}

    def fork_state(self, state: State, next_round: int, source: "Algorithm") -> State:
        """The server state a run forked from ``source``'s checkpoint continues with, from round
        ``next_round`` on (``rayfl fork``); ValueError saying why when it cannot continue."""
        expected = sorted(self.server_init(state["x"]))
        if sorted(state) != expected:
            raise ValueError(f"a server state with keys {expected} (the checkpoint holds "
                             f"{sorted(state)}: another algorithm or server optimizer)")
        return state

    # ----- client side -------------------------------------------------------------------
    def client_begin(self, task: ClientTask) -> LocalRule:
        """The round's local rule for one client."""
        return PLAIN_SGD

    def client_end(self, task: ClientTask, y: Vec, steps: int) -> ClientResult:
        """Payload and new state after ``steps`` local steps ended at ``y``."""
        return ClientResult({}, None)


#: what a ``client_state`` entry may be declared as
STATE_KINDS = ("model", "scalar", "buffers", "any")


def check_client_state(algorithm: Algorithm, state: dict, dim: int) -> None:
    """TypeError naming the algorithm and the entry when a client's returned ``state`` holds an
    entry its ``client_state`` does not declare, or one of another shape than declared
    (``dim``: the model's parameter count)."""
    declared = algorithm.client_state
    for key, value in state.items():
        kind = declared.get(key)
        numel = value.numel() if isinstance(value, torch.Tensor) else None
        if kind is None:
            problem = f"is not declared (client_state: {dict(declared)})"
        elif kind == "model" and (numel != dim or value.dim() != 1):
            problem = f"is declared 'model' but is {_shape(value)}, not a vector of {dim}"
        elif kind == "scalar" and numel != 1:
            problem = f"is declared 'scalar' but is {_shape(value)}, not a one-element tensor"
        elif kind == "buffers" and value is not None and (numel is None or value.dim() != 1):
            problem = f"is declared 'buffers' but is {_shape(value)}, not a flat vector or None"
        else:
            continue
        raise TypeError(f"{algorithm.name or type(algorithm).__name__}: client state entry "
                        f"{key!r} {problem}")


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def params_of(cls: type[Algorithm]) -> list[dataclasses.Field]:
    """The hyper-parameter fields of an algorithm (for docs and the tuner)."""
    return list(dataclasses.fields(cls.Params))
