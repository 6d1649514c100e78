"""Server wrappers: layers around the algorithm that compose like optax's chain.

A wrapper is a :class:`~rayfl.layers.Layer` in the ``wrappers`` section,
``[{name: ima, window: 5}, {name: my_pkg.mod:MyWrapper}]``, applied innermost first, each a
component resolved like an algorithm (a built-in name, a ``package.module:Name`` reference or a
name given to :func:`rayfl.register_wrapper`), so

    wrappers: [A, B]   ⇒   B(A(algorithm))

It owns one slot of the server state (``init``) and overrides what it changes:
the aggregate the layers under it see (``aggregate``), the model after their update
(``after``), the model deployed (``deployed``), the clients' learning rate (``client_lr``) and —
through its client half — what it asks its clients for (``client_apply`` may add a statistic of
the client, its training loss, to a payload summed into its own sums). It reads nothing of
another layer's slot. It declares its keys as a ``Params`` dataclass and its refusals and tuner
preset in its traits (:class:`~rayfl.layers.LayerTraits`). IMA (:mod:`rayfl.algorithms.ima`) is
one; ``examples/my_wrapper.py`` (a moving average) and ``examples/plateau.py`` (a learning-rate
schedule on the clients' loss) are others.
"""

from __future__ import annotations

from typing import Any

from rayfl.contract import calling, name_of
from rayfl.layers import Facts, Layer, declaration_problem
from rayfl.schema import ConfigError


class ServerWrapper(Layer):
    """Identity: a subclass overrides the halves it changes (see :class:`~rayfl.layers.Layer`)."""


def wrapper_classes(cfg: Any) -> list[tuple[str, type[ServerWrapper], Any]]:
    """(where, class, validated params) of every configured wrapper, innermost first."""
    return [(f"wrappers[{i}]", entry.component(), entry.params)
            for i, entry in enumerate(cfg.wrappers)]


def check_run(cfg: Any) -> None:
    """Every wrapper is a :class:`ServerWrapper` declaring itself as a layer does, and its own
    rules on the config hold (ConfigError on its entry; ComponentError naming its
    ``check_config`` when that raises); what its traits refuse is :mod:`rayfl.compat`'s."""
    for (where, cls, params), entry in zip(wrapper_classes(cfg), cfg.wrappers):
        problem = declaration_problem(cls)  # a ServerWrapper subclass: the registry's check
        if problem:
            raise ConfigError(f"{where}.name", entry.name, problem)
        with calling(name_of(cls, "check_config")):
            cls.check_config(params, cfg, where)


def wrappers_of(cfg: Any, facts: Facts) -> list[tuple[str, ServerWrapper]]:
    """The configured wrappers, innermost first, each with its config key (one that fails while
    being built is named)."""
    out = []
    for where, cls, params in wrapper_classes(cfg):
        with calling(name_of(cls, "__init__")):
            out.append((where, cls(params, facts)))
    return out


def label(algorithm: Any, wrappers: list) -> str:
    """The run's algorithm (its ``algorithm`` section and ``wrappers`` entries) as listed in
    tables and plots: ``fedavg``, ``fedavg+ima``."""
    return "+".join([algorithm.name] + [e.name for e in wrappers])
