"""Server wrappers: layers around the algorithm that compose like optax's chain.

A wrapper is a :class:`~rayfl.layers.Layer` in the run's ``layers`` list (the older spelling:
``wrappers``; :mod:`rayfl.layer_list`),
``[{name: ima, window: 5}, {name: my_pkg.mod:MyWrapper}]``, applied innermost first, each a
component resolved like an algorithm (a built-in name, a ``package.module:Name`` reference or a
name given to :func:`rayfl.register_wrapper`), so

    layers: [A, B]   ⇒   B(A(algorithm))

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

from rayfl.layers import Layer


class ServerWrapper(Layer):
    """Identity: a subclass overrides the halves it changes (see :class:`~rayfl.layers.Layer`)."""


def label(algorithm: Any, wrappers: list) -> str:
    """The run's algorithm (its ``algorithm`` section and its wrappers, entries with a
    ``name``) as listed in tables and plots: ``fedavg``, ``fedavg+ima``."""
    return "+".join([algorithm.name] + [e.name for e in wrappers])
