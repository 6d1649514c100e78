"""FedMIM (seed 001, "Enhance local consistency for free: a multi-step inertial momentum approach").

Increments of the global model, per local step: δ_t = (x_{t−1} − x_t)/K (δ = 0 before two global
models exist). With J = len(α) and, constant within round t,
    m_α = Σ_j α_j δ_{t−j+1},   m_β = Σ_j β_j δ_{t−j+1}     (α_1, β_1 on the newest increment)
every local step is
    y ← y − m_α − (1 − Σα) η_l g(y − m_β)
i.e. gradient point y − m_β and direction (1 − Σα) g + m_α/η_l (plain SGD then gives the step
above). The server is FedAvg (paper: uniform weights, η_g = 1). FedCM is J = 1, α = [1 − α_cm],
β = [0]; α = β = 0 is FedAvg.

K: the server cannot know each client's K_i, and :meth:`client_begin` is called before the
client trains, so K is the mean number of local steps the clients ran in the round that produced
the increment, weighted like the average: K = Σ p_i K_i (payload ``wk`` = Σ w_i K_i). A client
running K_i steps adds K_i m_α to its update, so the average adds Σ p_i K_i m_α — with this K
exactly Σα times the previous global move, whatever the spread of K_i. (The unweighted mean would
scale that by Σ p_i K_i / mean K_i, > 1 when large clients carry more weight: with Σα = 0.9 and
sample weighting on a Dirichlet(0.1) split the inertia then exceeds 1 and training diverges.)
With equal K_i (the paper's balanced clients) both are the paper's K.

History (``history``):
- ``broadcast`` (default, the paper's Algorithm 1: every client sees every global model): the
  server keeps the last J increments and sends m_α, m_β (two d-vectors) with x_t.
- ``participation``: each client keeps the global models *it* saw (the last one, the round it saw
  it, and its J − 1 newest increments; with the current x_t that is its last J + 1 models). An
  increment spanning a gap of g rounds is divided by g·K (the mean per-step move over the gap),
  so a long absence gives a stale, not an inflated, momentum. Under full participation this is
  the broadcast mode exactly.

Weight decay (unspecified in the paper) is added by the runtime at y and is scaled by (1 − Σα)
like the gradient. Clipping (``local.clip_norm``, not in the paper) acts on g only, never on the
inertial term. Rejected: local momentum and Adam (either would rescale the inertial step m_α/η_l,
Adam into sign-like steps of a different length) and IMA (δ is measured between the un-averaged
global models, so IMA would move the clients' start away from the history the inertia follows).
Defaults (paper): α = [0.6, 0.3], β = [0.9, 0.1], η_0 = 0.1, decay 0.998,
weight decay 1e-3, B = 50, E = 5.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from rayfl import schema
from rayfl.algorithms.base import (Aggregate, Algorithm, ClientResult, ClientTask, LocalRule,
                                   ServerParams, ServerRound, Traits, Vec)
from rayfl.schema import ConfigError


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@dataclass(frozen=True)
class FedMIMParams(ServerParams):
    """FedMIM hyper-parameters: the J weights α_j, β_j (index 0 = newest increment)."""

    alpha: list[float] = schema.field(
        factory=lambda: [0.6, 0.3],
        doc="inertial weights α_1..α_J on the J newest increments (α_j ≥ 0, Σα < 1)")
    beta: list[float] = schema.field(
        factory=lambda: [0.9, 0.1],
        doc="look-ahead weights β_1..β_J (β_j ≥ 0, same length as alpha)")
    history: Literal["broadcast", "participation"] = schema.field(
        "broadcast", doc="broadcast: one shared history (paper); participation: per-client "
                         "history of the global models that client saw (stale when absent)")

    def check(self, prefix: str) -> None:
        if not self.alpha:
            raise ConfigError(_key(prefix, "alpha"), self.alpha, "a non-empty list (J ≥ 1)")
        for j, a in enumerate(self.alpha):
            if a < 0:
                raise ConfigError(_key(prefix, f"alpha[{j}]"), a, "a value ≥ 0")
        if sum(self.alpha) >= 1:
            raise ConfigError(_key(prefix, "alpha"), self.alpha,
                              f"weights summing to less than 1 (sum is {sum(self.alpha):g})")
        if len(self.beta) != len(self.alpha):
            raise ConfigError(_key(prefix, "beta"), self.beta,
                              f"a list of the same length as alpha ({len(self.alpha)})")
        for j, b in enumerate(self.beta):
            if b < 0:
                raise ConfigError(_key(prefix, f"beta[{j}]"), b, "a value ≥ 0")


def _combine(weights: list[float], deltas: list[Vec]) -> Vec | None:
    """Σ_j w_j δ_j over the available increments (None when it is identically zero)."""
    terms = [(w, d) for w, d in zip(weights, deltas) if w != 0 and d is not None]
    if not terms:
        return None
    out = terms[0][1] * terms[0][0]
    for w, d in terms[1:]:
        out = out + d * w
    return out


class _MIMRule(LocalRule):
    """Gradient at y − m_β; direction (1 − Σα) g + m_α/η_l (None: the term is zero)."""

    def __init__(self, m_a: Vec | None, m_b: Vec | None, scale: float):
        self.m_a, self.m_b, self.scale = m_a, m_b, scale

    def grad_point(self, y: Vec) -> Vec:
        return y if self.m_b is None else y - self.m_b

    def direction(self, g: Vec, y: Vec, lr: float) -> Vec:
        d = g if self.scale == 1.0 else g * self.scale
        return d if self.m_a is None else d + self.m_a / lr


@dataclass(frozen=True)
class FedMIMState:
    """K, the mean local steps of the round that produced the newest increment, and (history
    ``broadcast``) the J newest increments δ, newest first."""

    LEGACY: ClassVar[dict[str, str]] = {"mim_k": "k", "mim_deltas": "deltas"}

    k: Vec
    deltas: Vec | None = None


class FedMIM(Algorithm):
    """Server state: K and, by history mode, the increments (broadcast) or none."""

    name = "fedmim"
    Params = FedMIMParams
    traits = Traits(
        weighting="uniform", compare_plain=("momentum",),
        asynchronous="its inertial step is built from increments between consecutive "
                     "synchronous global models",
        averaging="its increments δ are taken between un-averaged global models",
        local_momentum="its inertial step m_α is the momentum; local momentum would amplify it "
                       "by 1/(1 − momentum)",
        adam="Adam would rescale the inertial step m_α/η_l per coordinate",
        search_space={"algorithm.alpha": {"type": "weights", "low": 0.0, "high": 0.95},
                      "algorithm.beta": {"type": "weights", "low": 0.0, "high": 1.0}})

    def __init__(self, params=None, **kw):
        super().__init__(params, **kw)
        self.p.check("algorithm")
        self.alpha = [float(a) for a in self.p.alpha]
        self.beta = [float(b) for b in self.p.beta]
        self.J = len(self.alpha)
        self.scale = 1.0 - sum(self.alpha)  # A = 1 − Σα, the weight of the fresh gradient
        self.per_client = self.p.history == "participation"
        # the history mode decides the client state: broadcast mode keeps none at all
        if self.per_client:
            self.traits = dataclasses.replace(type(self).traits, client_state={
                "mim_x": "model", "mim_t": "scalar",
                **{f"mim_d{j}": "model" for j in range(1, self.J)}})

    # ----- server ------------------------------------------------------------------------
    def server_init(self, x0: Vec) -> FedMIMState:
        k = torch.ones((), dtype=torch.float64)
        if self.per_client:
            return FedMIMState(k)
        return FedMIMState(k, torch.zeros((0, x0.numel()), dtype=x0.dtype))  # newest first

    def broadcast(self, x: Vec, state: FedMIMState, t: int) -> dict[str, Vec]:
        bc = {"x": x}
        if self.per_client:
            bc["mim_k"] = state.k
            return bc
        deltas = list(state.deltas)
        m_a, m_b = _combine(self.alpha, deltas), _combine(self.beta, deltas)
        if m_a is not None:
            bc["mim_ma"] = m_a
        if m_b is not None:
            bc["mim_mb"] = m_b
        return bc

    def server_update(self, x: Vec, state: FedMIMState, agg: Aggregate, srv: ServerRound):
        new_x, _, metrics = super().server_update(x, state, agg, srv)  # x ← x − η_g Δ̄
        k = agg.extras["wk"] / agg.weight_sum if agg.count else 0.0  # K = Σ p_i K_i
        new = FedMIMState(torch.tensor(k if k > 0 else 1.0, dtype=torch.float64))
        if not self.per_client:
            delta = ((x - new_x) / float(k) if k > 0
                     else torch.zeros_like(x))  # δ_{t+1} = (x_t − x_{t+1})/K
            new = dataclasses.replace(new, deltas=torch.cat([delta[None],
                                                             state.deltas[:self.J - 1]]))
            metrics = {**metrics, "mim_delta_norm": float(delta.norm())}
        return new_x, new, metrics

    # ----- client ------------------------------------------------------------------------
    def _client_deltas(self, bc, cstate, t) -> list[Vec | None]:
        """The client's J newest increments (participation mode), newest first."""
        if cstate is None:
            return [None] * self.J
        gap = t - int(cstate["mim_t"].reshape(-1)[0].item())
        k = float(bc["mim_k"].reshape(-1)[0].item())
        newest = (cstate["mim_x"] - bc["x"]) / float(k * gap) if gap > 0 else None
        return [newest] + [cstate[f"mim_d{j}"] for j in range(1, self.J)]

    def client_train(self, task: ClientTask, ctx) -> ClientResult:
        bc = task.bc
        if self.per_client:
            deltas = self._client_deltas(bc, task.state, task.t)
            m_a, m_b = _combine(self.alpha, deltas), _combine(self.beta, deltas)
        else:
            m_a, m_b = bc.get("mim_ma"), bc.get("mim_mb")
        y = ctx.train(_MIMRule(m_a, m_b, self.scale))
        payload = {"wk": task.weight * ctx.steps}
        if not self.per_client:
            return ClientResult(y, payload)
        bc, t = task.bc, task.t
        deltas = self._client_deltas(bc, task.state, t)
        x = bc["x"]
        new = {"mim_x": x.clone(), "mim_t": torch.tensor([float(t)], dtype=torch.float64)}
        for j in range(1, self.J):  # keep the J − 1 newest increments for the next visit
            d = deltas[j - 1]
            new[f"mim_d{j}"] = d.clone() if d is not None else torch.zeros_like(x)
        return ClientResult(y, payload, new)
