"""IMA, iterative moving averaging (seed 004, Zhou et al., "Understanding and Improving Model
Averaging in Federated Learning on Heterogeneous Data"), as a wrapper around any algorithm.

Rounds are 0-indexed. From round t_s on (``start`` < 1: ⌊start · R⌋; ≥ 1: the round index), after
the inner algorithm's server update of round t the server keeps its output w^(t) in a window of
the last P (``window``) outputs and replaces the global model by their plain mean
    w_IMA^(t) = (1/P) Σ_{τ=0}^{P−1} w^(t−τ)        (fewer while fewer exist)
which is what the clients of round t+1 start from and what is evaluated (clients of round t_s
itself still get the plain w^(t_s−1), as in the authors' code). The window holds the inner
algorithm's outputs, never IMA's; it is filled from round t_s − P + 1, so it is full at t_s.

Which "output" (the paper only says IMA "can be readily integrated"; this follows the authors'
code, spec 004 §1.5):
- ``output`` (every algorithm except the adaptive server optimisers): w^(t) is the inner's
  ``state["x"]`` after its update; the mean is written back as the inner's x, so the inner's next
  update starts from the model its clients started from (for FedAvg: w^(t) = Σ p_i y_i, FMA).
- ``target`` (fedadam / fedyogi / fedadagrad): the window holds the pseudo-target x_t − Δ̄ (the
  plain weighted average of the client models); from t_s the inner's server optimiser is fed
  Δ̄' = x_t − mean(window) instead of Δ̄, and its output is what clients receive.
``average="auto"`` picks ``target`` for those three names, ``output`` otherwise.

Client exploration: from t_s the local lr decays by ``decay_after`` per round, continuing from the
value reached: η_l(t) = η_l^inner(t_s) · decay_after^(t − t_s) (= η_0 · decay^t_s ·
decay_after^(t − t_s) for the default schedule; paper: decay 0.99, decay_after 0.97). If the
inner has ``reset_moments(state)`` (the FedOpt family) and ``reset_server_moments`` is set, its
moments are reset at t_s, before that round's update.

Everything else (client rule and state, set-up hooks, client models, weights) is the inner's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import torch

from rayfl.algorithms.base import Aggregate, Algorithm, ClientResult, LocalRule, State, Vec

TARGET_FAMILY = frozenset({"fedadam", "fedyogi", "fedadagrad"})
_BUF, _RAW = "ima_buf", "ima_raw"


def start_round(start: float, rounds: int) -> int:
    """t_s: ⌊start · rounds⌋ for a fraction (< 1), else the round index ⌊start⌋."""
    if start < 1:
        return int(math.floor(start * rounds + 1e-9))
    return int(math.floor(start + 1e-9))


class IMA(Algorithm):
    """Wraps ``inner``; IMA's own state keys are ``ima_buf`` (window, oldest first), ``ima_raw``."""

    def __init__(self, inner: Algorithm, window: int = 5, start: int = 0,
                 decay_after: float = 0.97, reset_server_moments: bool = True,
                 average: Literal["auto", "output", "target"] = "auto"):
        if window < 1:
            raise ValueError(f"IMA window must be ≥ 1, got {window}")
        self.inner = inner
        self.window, self.t_s = int(window), int(start)
        self.decay_after = float(decay_after)
        self.reset_server_moments = bool(reset_server_moments)
        if average == "auto":
            average = "target" if inner.name in TARGET_FAMILY else "output"
        self.average = average
        # the inner's identity and hooks, seen through the wrapper
        self.name = inner.name
        self.Params = inner.Params
        self.p, self.server_lr = inner.p, inner.server_lr
        self.weighting, self.num_clients, self.rounds = (inner.weighting, inner.num_clients,
                                                         inner.rounds)
        self.client_state_keys = inner.client_state_keys
        self.needs_setup = inner.needs_setup
        self.needs_client_models = inner.needs_client_models

    # ----- state split -------------------------------------------------------------------
    @staticmethod
    def _inner(state: State) -> State:
        return {k: v for k, v in state.items() if k not in (_BUF, _RAW)}

    @staticmethod
    def _own(state: State) -> State:
        return {k: state[k] for k in (_BUF, _RAW) if k in state}

    def active(self, t: int) -> bool:
        """Whether round t's update is followed by averaging (t ≥ t_s)."""
        return t >= self.t_s

    # ----- server ------------------------------------------------------------------------
    def server_init(self, x0: Vec) -> State:
        state = self.inner.server_init(x0)
        state[_BUF] = torch.zeros((0, x0.numel()), dtype=x0.dtype)
        return state

    def broadcast(self, state: State, t: int) -> dict[str, Vec]:
        return self.inner.broadcast(self._inner(state), t)

    def local_lr(self, t: int, lr0: float, decay: float) -> float:
        if t < self.t_s:
            return self.inner.local_lr(t, lr0, decay)
        return self.inner.local_lr(self.t_s, lr0, decay) * self.decay_after ** (t - self.t_s)

    def aggregation_weights(self, state: State, client_ids, num_samples) -> list[float]:
        return self.inner.aggregation_weights(self._inner(state), client_ids, num_samples)

    def _push(self, buf: Vec, w: Vec, t: int) -> Vec:
        if t < self.t_s - self.window + 1:  # too early to ever be averaged
            return buf
        return torch.cat([buf[-(self.window - 1):] if self.window > 1 else buf[:0], w[None]])

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        inner_state, buf = self._inner(state), state[_BUF]
        if t == self.t_s and self.reset_server_moments:
            reset = getattr(self.inner, "reset_moments", None)
            if reset is not None:
                out = reset(inner_state)
                inner_state = inner_state if out is None else out
        own: dict = {}
        if self.average == "target":
            target = inner_state["x"] - agg.delta_mean  # Σ p_i y_i (clients start at x)
            if agg.count:
                buf = self._push(buf, target, t)
            if self.active(t) and agg.count and len(buf):
                agg = dataclasses.replace(agg, delta_mean=inner_state["x"] - buf.mean(dim=0))
                own[_RAW] = target
            new, metrics = self.inner.server_update(inner_state, agg, t)
        else:
            new, metrics = self.inner.server_update(inner_state, agg, t)
            buf = self._push(buf, new["x"], t)
            if self.active(t) and len(buf):
                own[_RAW] = new["x"]
                new = {**new, "x": buf.mean(dim=0)}
        return {**new, _BUF: buf, **own}, {**metrics, "ima_active": float(self.active(t)),
                                           "ima_window_len": float(len(buf))}

    def deployed(self, state: State) -> Vec:
        return self.inner.deployed(self._inner(state))

    def extra_models(self, state: State) -> dict[str, Vec]:
        """The inner's extras, plus its un-averaged output (``ima_inner``) once IMA is on."""
        out = dict(self.inner.extra_models(self._inner(state)))
        if self.average == "output" and _RAW in state:
            out["ima_inner"] = state[_RAW]
        return out

    # ----- client (the inner's) ------------------------------------------------------------
    def client_begin(self, bc, cstate, t, lr, client_id=None) -> LocalRule:
        return self.inner.client_begin(bc, cstate, t, lr, client_id=client_id)

    def client_end(self, bc, cstate, y, steps, lr, weight, t) -> ClientResult:
        return self.inner.client_end(bc, cstate, y, steps, lr, weight, t)

    # ----- set-up hooks (the inner's) ----------------------------------------------------
    def client_setup(self, x, y):
        return self.inner.client_setup(x, y)

    def server_setup(self, state: State, client_ids, summaries: Vec) -> State:
        return {**self.inner.server_setup(self._inner(state), client_ids, summaries),
                **self._own(state)}

    def receive_client_models(self, state: State, client_ids, models: Vec) -> State:
        return {**self.inner.receive_client_models(self._inner(state), client_ids, models),
                **self._own(state)}


def wrap_ima(inner: Algorithm, ima_cfg, rounds: int) -> Algorithm:
    """``inner`` wrapped in IMA per an ``ima:`` config section (None: ``inner`` unchanged)."""
    if ima_cfg is None:
        return inner
    return IMA(inner, window=ima_cfg.window, start=start_round(ima_cfg.start, rounds),
               decay_after=ima_cfg.decay_after,
               reset_server_moments=ima_cfg.reset_server_moments)
