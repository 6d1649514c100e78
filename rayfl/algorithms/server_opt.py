"""Server optimizers as init/update pairs on the server's pseudo-gradient (optax's shape).

A server optimizer turns the direction D an algorithm computes each round (FedAvg: Δ̄) into the
step the server takes, x ← x − step, keeping its own state (``m``, ``v``) beside x in the server
state. FedAvgM, FedAdam, FedYogi and FedAdagrad are FedAvg with one of these; any algorithm whose
traits say ``server_opt=True`` takes any of them through the ``server_opt`` config section.

    sgd        step = η_g D
    momentum   m ← β m + D;   step = η_g m          (nesterov: η_g (D + β m), PyTorch's form)
    adam       u = −D;  m ← β1 m + (1 − β1) u;  v ← β2 v + (1 − β2) u²;  step = −η_g m / (√v + τ)
    yogi       as adam with v ← v − (1 − β2) u² sign(v − u²)
    adagrad    as adam with v ← v + u²
The adaptive three follow Reddi et al. (2021), "Adaptive Federated Optimization": no bias
correction, m_{-1} = 0, v_{-1} = v_init (default τ²); a mid-run restart (IMA's moment reset) sets
m = v = 0, as the IMA authors' code does.

A server optimiser is a component like any other: ``server_opt.name`` names a built-in, a
``package.module:Name`` reference or a name given to :func:`rayfl.register_server_opt`, a
callable ``(section, lr) -> ServerOpt`` from the validated ``server_opt`` section (its own keys,
and the component's ``Params`` in ``section.params``: a function declares them as an attribute,
``fn.Params = MyParams``) and the server learning rate. Its ``update`` may take the model x as a
third argument (:class:`ServerOpt`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

Vec = torch.Tensor
OptState = dict[str, Any]


@dataclass(frozen=True)
class ServerOpt:
    """``init(x) -> state``; ``update(D, state) -> (step, new state, metrics)``, or
    ``update(D, state, x)`` to also read the model the step is taken from (a Lookahead's slow
    weights follow it; lent, read-only); ``reset(x) -> state`` restarts the optimizer mid-run
    (IMA at t_s; default: ``init``)."""

    init: Callable[[Vec], OptState]
    update: Callable[..., tuple[Vec, OptState, dict]]
    adaptive: bool = False  # per-coordinate step sizes (IMA then averages the target, not x)
    reset: Callable[[Vec], OptState] | None = None

    def restart(self, x: Vec) -> OptState:
        """The optimizer state a mid-run restart gives."""
        return (self.reset or self.init)(x)

    @property
    def sees_x(self) -> bool:
        """Whether ``update`` takes the model x as a third argument."""
        try:
            params = inspect.signature(self.update).parameters.values()
        except (TypeError, ValueError):  # a callable without a signature: the two-argument form
            return False
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in params)


def sgd(lr: float) -> ServerOpt:
    """step = η_g D."""
    return ServerOpt(lambda x: {}, lambda d, s: (lr * d, {}, {}))


def momentum(lr: float, beta: float, nesterov: bool = False) -> ServerOpt:
    """Heavy ball (or Nesterov) server momentum, buffer ``m`` initialised to 0."""

    def update(d: Vec, state: OptState):
        m = beta * state["m"] + d  # m ← β m + D
        step = d + beta * m if nesterov else m
        return lr * step, {"m": m}, {"momentum_norm": float(m.norm())}

    return ServerOpt(lambda x: {"m": torch.zeros_like(x)}, update)


def _adaptive(lr: float, beta1: float, tau: float, v_init: float,
              v_update: Callable[[Vec, Vec], Vec]) -> ServerOpt:
    def update(d: Vec, state: OptState):
        u = -d  # the paper's ascent direction
        m = beta1 * state["m"] + (1 - beta1) * u
        v = v_update(state["v"], u * u)
        step = -(lr * m / (v.sqrt() + tau))
        return step, {"m": m, "v": v}, {"momentum_norm": float(m.norm()),
                                         "v_mean": float(v.mean())}

    def init(x: Vec) -> OptState:
        return {"m": torch.zeros_like(x), "v": torch.full_like(x, v_init)}

    def reset(x: Vec) -> OptState:  # the IMA authors' code zeroes both moments at t_s
        return {"m": torch.zeros_like(x), "v": torch.zeros_like(x)}

    return ServerOpt(init, update, adaptive=True, reset=reset)


def adam(lr: float, beta1: float, beta2: float, tau: float, v_init: float) -> ServerOpt:
    """FedAdam's server rule: v ← β2 v + (1 − β2) u²."""
    return _adaptive(lr, beta1, tau, v_init, lambda v, u2: beta2 * v + (1 - beta2) * u2)


def yogi(lr: float, beta1: float, beta2: float, tau: float, v_init: float) -> ServerOpt:
    """FedYogi's server rule: v ← v − (1 − β2) u² sign(v − u²)."""
    return _adaptive(lr, beta1, tau, v_init,
                     lambda v, u2: v - (1 - beta2) * u2 * torch.sign(v - u2))


def adagrad(lr: float, beta1: float, tau: float, v_init: float, beta2: float = 0.0) -> ServerOpt:
    """FedAdagrad's server rule: v ← v + u² (``beta2`` is ignored)."""
    return _adaptive(lr, beta1, tau, v_init, lambda v, u2: v + u2)


def build(name: str, lr: float, momentum_: float = 0.9, nesterov: bool = False,
          beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
          v_init: float | None = None) -> ServerOpt:
    """The named built-in server optimizer (``sgd``, ``momentum``, ``adam``, ``yogi``,
    ``adagrad``)."""
    if name == "sgd":
        return sgd(lr)
    if name == "momentum":
        return momentum(lr, momentum_, nesterov)
    v0 = tau**2 if v_init is None else v_init
    return {"adam": adam, "yogi": yogi, "adagrad": adagrad}[name](
        lr, beta1=beta1, beta2=beta2, tau=tau, v_init=v0)


def _of(name: str, rule: str) -> Callable[[Any, float], ServerOpt]:
    """The built-in ``name`` as a component: (the ``server_opt`` section, lr) -> ServerOpt."""
    def component(section: Any, lr: float) -> ServerOpt:
        return build(name, lr, section.momentum, section.nesterov, section.beta1,
                     section.beta2, section.tau, section.v_init)

    component.__name__ = component.__qualname__ = f"{name}_of"
    component.__doc__ = f"{rule} (keys of the server_opt section)."
    return component


sgd_of = _of("sgd", "step = η_g D")
momentum_of = _of("momentum", "m ← β m + D; step = η_g m, Nesterov η_g (D + β m)")
adam_of = _of("adam", "FedAdam: v ← β2 v + (1 − β2) u², step = −η_g m / (√v + τ), u = −D")
yogi_of = _of("yogi", "FedYogi: v ← v − (1 − β2) u² sign(v − u²)")
adagrad_of = _of("adagrad", "FedAdagrad: v ← v + u²")
