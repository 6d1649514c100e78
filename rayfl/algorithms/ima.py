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
The key ``average: auto`` picks ``target`` when the inner's server optimizer is adaptive,
``output`` otherwise.

Client exploration: from t_s the local lr decays by ``decay_after`` per round, continuing from the
value reached: η_l(t) = η_l^inner(t_s) · decay_after^(t − t_s) (= η_0 · decay^t_s ·
decay_after^(t − t_s) for the default schedule; paper: decay 0.99, decay_after 0.97). When the
inner's server optimizer is adaptive and ``reset_server_moments`` is set, its moments are
re-initialised at t_s, before that round's update.

IMA is refused (config error) around algorithms whose class gives an ``averaging_reason``
(adabest deploys x̄, which IMA never averages; fedeve's clients start from the mean − η_g·M;
fedmim's increments are measured between un-averaged models), around models with BatchNorm
statistics and in the event-driven modes.

It is a :class:`~rayfl.algorithms.wrapper.ServerWrapper`: ``wrappers: [{name: ima, window: 5}]``;
client rule and state, capabilities and weights stay the inner's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch

from rayfl.algorithms.base import Aggregate, Algorithm, State, Vec
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.schema import ConfigError, field

_BUF, _RAW = "ima_buf", "ima_raw"


def start_round(start: float, rounds: int) -> int:
    """t_s: ⌊start · rounds⌋ for a fraction (< 1), else the round index ⌊start⌋."""
    if start < 1:
        return int(math.floor(start * rounds + 1e-9))
    return int(math.floor(start + 1e-9))


@dataclass(frozen=True)
class IMAParams:
    """IMA's keys (an entry of ``wrappers``)."""

    window: int = field(5, doc="P: number of recent global models averaged", lo=1)
    start: float = field(0.75, doc="t_s as a fraction of rounds (<1) or a round index (>=1)",
                         lo=0.0)
    decay_after: float = field(0.97, doc="per-round local lr decay from t_s on", lo=0.0, hi=1.0,
                               lo_open=True)
    reset_server_moments: bool = field(True, doc="zero FedAdam/Yogi moments at t_s")
    average: Literal["auto", "output", "target"] = field(
        "auto", doc="what the window holds: output (the inner's x after its update), target "
                    "(the client average fed to an adaptive server optimiser); auto: target "
                    "when the server optimiser is adaptive, else output")


class IMA(ServerWrapper):
    """IMA around ``inner``; its own state keys are ``ima_buf`` (window, oldest first), ``ima_raw``."""

    name = "ima"
    Params = IMAParams
    own_keys = (_BUF, _RAW)
    averages_rounds = True
    async_reason = "IMA averages the models of consecutive synchronous rounds"
    model_buffers_reason = ("it averages parameters over rounds; one round's BatchNorm "
                            "statistics do not belong to that average; the paper uses "
                            "GroupNorm: resnet18_gn")
    inner_model = "ima_inner"

    def __init__(self, inner: Algorithm, params: IMAParams | None = None, *, rounds: int = 1):
        super().__init__(inner, params, rounds=rounds)
        p = self.params
        self.window, self.t_s = int(p.window), start_round(p.start, rounds)
        self.decay_after = float(p.decay_after)
        self.reset_server_moments = bool(p.reset_server_moments)
        adaptive = inner.server_opt.adaptive
        self.average = ("target" if adaptive else "output") if p.average == "auto" else p.average

    @classmethod
    def check_config(cls, params: IMAParams, cfg, where: str) -> None:
        t_s = start_round(params.start, cfg.rounds)
        if t_s >= cfg.rounds:
            raise ConfigError(f"{where}.start", params.start,
                              f"a fraction < 1 or a round index < rounds = {cfg.rounds} "
                              f"(it starts IMA at round {t_s}, after the last round)")

    @classmethod
    def search_space(cls) -> dict[str, dict]:
        """The tuner's preset ``ima``: the window P and the start t_s."""
        return {"wrappers.ima.window": {"type": "int", "low": 1, "high": 10},
                "wrappers.ima.start": {"low": 0.5, "high": 0.95}}

    def active(self, t: int) -> bool:
        """Whether round t's update is followed by averaging (t ≥ t_s)."""
        return t >= self.t_s

    # ----- server ------------------------------------------------------------------------
    def server_init(self, x0: Vec) -> State:
        state = self.inner.server_init(x0)
        state[_BUF] = torch.zeros((0, x0.numel()), dtype=x0.dtype)
        return state

    def local_lr(self, t: int, lr0: float, decay: float) -> float:
        if t < self.t_s:
            return self.inner.local_lr(t, lr0, decay)
        return self.inner.local_lr(self.t_s, lr0, decay) * self.decay_after ** (t - self.t_s)

    def _push(self, buf: Vec, w: Vec, t: int) -> Vec:
        if t < self.t_s - self.window + 1:  # too early to ever be averaged
            return buf
        return torch.cat([buf[-(self.window - 1):] if self.window > 1 else buf[:0], w[None]])

    def server_update(self, state: State, agg: Aggregate, t: int) -> tuple[State, dict]:
        inner_state, buf = self.strip(state), state[_BUF]
        if t == self.t_s and self.reset_server_moments and self.inner.server_opt.adaptive:
            inner_state = {**inner_state, **self.inner.server_opt.restart(inner_state["x"])}
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

    def fork_state(self, state: State, next_round: int, source: Algorithm) -> State:
        """A fork keeps the inner's state; the window must hold the outputs IMA needs before
        ``next_round``: none (the fork precedes t_s − P + 1), or the source's own window."""
        src_ima = source if isinstance(source, IMA) else None
        inner = self.inner.fork_state(self.strip(state), next_round, self.unwrap(source))
        need = max(0, next_round - max(self.t_s - self.window + 1, next_round - self.window))
        if need == 0:
            return {**inner, _BUF: state["x"].new_zeros((0, state["x"].numel()))}
        buf = state.get(_BUF)
        if src_ima is None or src_ima.average != self.average or buf is None or len(buf) < need:
            raise ValueError(
                f"the {need} output(s) of the rounds before the fork in IMA's window (start "
                f"{self.t_s}, window {self.window}); the checkpoint holds "
                f"{0 if buf is None else len(buf)}: fork at a round ≤ "
                f"{self.t_s - self.window + 1}, or from a run with the same ima settings")
        return {**inner, _BUF: buf[len(buf) - need:]}

    def extra_models(self, state: State) -> dict[str, Vec]:
        """The inner's extras, plus its un-averaged output (``ima_inner``) once IMA is on."""
        out = dict(self.inner.extra_models(self.strip(state)))
        if self.average == "output" and _RAW in state:
            out[self.inner_model] = state[_RAW]
        return out
