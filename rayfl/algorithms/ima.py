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
its slot holds the window; client rule and state, capabilities and weights stay the inner's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch

from rayfl.algorithms.base import Aggregate, ServerRound, Vec
from rayfl.algorithms.wrapper import ServerWrapper
from rayfl.layers import Facts, LayerTraits
from rayfl.schema import ConfigError, field


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


@dataclass(frozen=True)
class Window:
    """IMA's slot: the window of the inner's outputs (oldest first) and, in a round IMA
    averaged, the inner's own output (the ``ima_inner`` model)."""

    buf: Vec
    raw: Vec | None = None


class IMA(ServerWrapper):
    """IMA around the layers under it; its slot is the :class:`Window`."""

    name = "ima"
    Params = IMAParams
    traits = LayerTraits(
        averages_rounds=True, inner_model="ima_inner",
        asynchronous="IMA averages the models of consecutive synchronous rounds",
        buffers="it averages parameters over rounds; one round's BatchNorm statistics do not "
                "belong to that average; the paper uses GroupNorm: resnet18_gn",
        search_space={"wrappers.ima.window": {"type": "int", "low": 1, "high": 10},
                      "wrappers.ima.start": {"low": 0.5, "high": 0.95}})

    def __init__(self, params: IMAParams | None = None, facts: Facts | None = None):
        super().__init__(params, facts)
        p = self.params
        self.window, self.t_s = int(p.window), start_round(p.start, self.facts.rounds)
        self.decay_after = float(p.decay_after)
        self.reset_server_moments = bool(p.reset_server_moments)
        adaptive = self.facts.adaptive_server_opt
        self.average = ("target" if adaptive else "output") if p.average == "auto" else p.average

    @classmethod
    def check_config(cls, params: IMAParams, cfg, where: str) -> None:
        t_s = start_round(params.start, cfg.rounds)
        if t_s >= cfg.rounds:
            raise ConfigError(f"{where}.start", params.start,
                              f"a fraction < 1 or a round index < rounds = {cfg.rounds} "
                              f"(it starts IMA at round {t_s}, after the last round)")

    def active(self, t: int) -> bool:
        """Whether round t's update is followed by averaging (t ≥ t_s)."""
        return t >= self.t_s

    def init(self, x0: Vec) -> Window:
        return Window(torch.zeros((0, x0.numel()), dtype=x0.dtype))

    def client_lr(self, slot: Window, t: int, inner: Callable[[int], float]) -> float:
        if t < self.t_s:
            return inner(t)
        return inner(self.t_s) * self.decay_after ** (t - self.t_s)

    def _push(self, buf: Vec, w: Vec, t: int) -> Vec:
        if t < self.t_s - self.window + 1:  # too early to ever be averaged
            return buf
        return torch.cat([buf[-(self.window - 1):] if self.window > 1 else buf[:0], w[None]])

    def aggregate(self, slot: Window, agg: Aggregate, sums: dict, srv: ServerRound):
        """Target mode: the window of client averages feeds the server optimiser (and its
        moments restart at t_s)."""
        t, buf, raw = srv.t, slot.buf, None
        if t == self.t_s and self.reset_server_moments and srv.adaptive:
            agg = dataclasses.replace(agg, restart_server_opt=True)
        if self.average == "target":
            target = srv.x - agg.delta_mean  # Σ p_i y_i (clients start at x)
            if agg.count:
                buf = self._push(buf, target, t)
            if self.active(t) and agg.count and len(buf):
                agg = dataclasses.replace(agg, delta_mean=srv.x - buf.mean(dim=0))
                raw = target
        return agg, Window(buf, raw), {}

    def after(self, slot: Window, x: Vec, srv: ServerRound):
        """Output mode: the window of the inner's outputs; their mean is the new model."""
        buf, raw = slot.buf, slot.raw
        if self.average == "output":
            buf = self._push(buf, x, srv.t)
            if self.active(srv.t) and len(buf):
                raw, x = x, buf.mean(dim=0)
        return x, Window(buf, raw), {"ima_active": float(self.active(srv.t)),
                                     "ima_window_len": float(len(buf))}

    def extra_models(self, slot: Window, inner: Vec) -> dict[str, Vec]:
        """The inner's un-averaged output (``ima_inner``) in a round IMA averaged it."""
        if slot.raw is None or self.average == "target":  # target: a client average
            return {}
        return {self.traits.inner_model: slot.raw}

    def fork(self, slot: Window, next_round: int, source: "IMA") -> Window:
        """A fork's window must hold the outputs IMA needs before ``next_round``: none (the
        fork precedes t_s − P + 1), or the source's own window."""
        need = max(0, next_round - max(self.t_s - self.window + 1, next_round - self.window))
        if need == 0:
            return Window(slot.buf[:0])
        same = isinstance(source, IMA) and source.average == self.average
        if not same or len(slot.buf) < need:
            raise ValueError(
                f"the {need} output(s) of the rounds before the fork in IMA's window (start "
                f"{self.t_s}, window {self.window}); the checkpoint holds "
                f"{len(slot.buf) if same else 0}: fork at a round ≤ "
                f"{self.t_s - self.window + 1}, or from a run with the same ima settings")
        return Window(slot.buf[len(slot.buf) - need:])

    def from_legacy(self, old: dict) -> Window:
        """The slot of a rayfl 0.1 checkpoint (``ima_buf``, ``ima_raw`` in the flat state)."""
        return Window(old["ima_buf"], old.get("ima_raw"))
