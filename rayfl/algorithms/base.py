"""The algorithm interface: client step, client state, server state and server update on flat vectors.

An algorithm is math, not plumbing. It sees flat parameter vectors (``torch.Tensor`` of shape
``(d,)``) and small dicts of them; it never sees Ray, actors, files or models. The runtime:

1. calls :meth:`Algorithm.server_init` once with the initial model ``x_0``;
2. each round ``t`` calls :meth:`broadcast` (what every sampled client receives; ``bc["x"]`` is
   the point local training starts from) and :meth:`aggregation_weights`;
3. for each sampled client, inside a client actor: :meth:`client_begin` gives a
   :class:`LocalRule` (where to take the gradient, how to correct it), the runtime runs the local
   optimizer for ``K_i`` steps, then :meth:`client_end` returns the client's payload (summed by
   the runtime across clients) and its new persistent state;
4. calls :meth:`server_update` with the :class:`Aggregate` of all payloads.

Every payload value is *summed* over the round's completed clients: an algorithm that wants a
weighted mean multiplies by ``weight`` in :meth:`client_end` and divides by
``agg.weight_sum`` in :meth:`server_update`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rayfl import schema

Vec = torch.Tensor
State = dict[str, Any]


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


class Algorithm:
    """Base class; subclasses override what their paper changes. Defaults are FedAvg's."""

    name: ClassVar[str] = ""
    Params: ClassVar[type] = ServerParams
    #: what ``aggregation.weighting: auto`` means for this algorithm (its paper's choice)
    paper_weighting: ClassVar[str] = "samples"
    #: ``aggregation.weighting`` values besides samples / uniform that the algorithm defines
    extra_weightings: ClassVar[tuple[str, ...]] = ()
    #: names of per-client persistent vectors (empty: the algorithm keeps no client state)
    client_state_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: Any = None, *, weighting: str = "samples", num_clients: int = 1,
                 rounds: int = 1, local_momentum: float = 0.0):
        self.p = params if params is not None else self.Params()
        self.server_lr = self.p.server_lr
        self.weighting = weighting
        self.num_clients = num_clients
        self.rounds = rounds
        self.local_momentum = local_momentum  # ρ of local heavy-ball SGD (0: plain SGD)

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

    # ----- server side -------------------------------------------------------------------
    def server_init(self, x0: Vec) -> State:
        """Initial server state; ``state["x"]`` is the global model x_0."""
        return {"x": x0.clone()}

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

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        """FedAvg: x ← x − η_g Δ̄. Returns the new state and the algorithm's own metrics."""
        new = dict(state)
        new["x"] = state["x"] - self.server_lr * agg.delta_mean
        return new, {}

    def deployed(self, state: State) -> Vec:
        """The model that is evaluated and reported (and saved as the final model)."""
        return state["x"]

    def extra_models(self, state: State) -> dict[str, Vec]:
        """Further models worth evaluating each eval round, by metric prefix (e.g. AdaBest's x_{t+1})."""
        return {}

    # ----- client side -------------------------------------------------------------------
    def client_begin(self, bc: dict[str, Vec], cstate: dict[str, Vec] | None, t: int,
                     lr: float, client_id: int | None = None) -> LocalRule:
        """The round's local rule for one client, given the broadcast and its state."""
        return PLAIN_SGD

    def client_end(self, bc: dict[str, Vec], cstate: dict[str, Vec] | None, y: Vec, steps: int,
                   lr: float, weight: float, t: int) -> ClientResult:
        """Payload and new state after ``steps`` local steps ended at ``y``."""
        return ClientResult({}, None)

    # ----- optional one-off set-up (fedmsi's similarity graph) ---------------------------
    needs_setup: ClassVar[bool] = False

    def client_setup(self, x, y) -> Vec | None:  # pragma: no cover - overridden where used
        """Per-client summary sent once before round 0 (raw inputs ``x``, labels ``y``)."""
        return None

    def server_setup(self, state: State, client_ids, summaries: Vec) -> State:  # pragma: no cover
        """Use all clients' set-up summaries (one row per client, in ``client_ids`` order)."""
        return state

    #: set when the server must keep each participant's final local model (fedmsi anchors)
    needs_client_models: ClassVar[bool] = False

    def receive_client_models(self, state: State, client_ids, models: Vec) -> State:
        """Store the round's final local models (rows in ``client_ids`` order)."""
        return state


def params_of(cls: type[Algorithm]) -> list[dataclasses.Field]:
    """The hyper-parameter fields of an algorithm (for docs and the tuner)."""
    return list(dataclasses.fields(cls.Params))
