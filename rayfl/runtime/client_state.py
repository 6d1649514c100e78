"""A client's persistent state as it is stored: the :class:`~rayfl.layers.ClientState` tree as
named arrays (one ``.npz`` per version in the state store, read without pickle).

Names are paths in the tree: ``algorithm.c``, ``layers.2.residual``, ``buffers``. States written
by rayfl 0.1 (one flat dict: the algorithm's entries, ``_transform{i}_{name}`` for transform i's,
``_model_buffers``) are read into the same tree.
"""

from __future__ import annotations

from typing import Any

from rayfl.layers import ClientState

_ALGORITHM, _LAYERS, _BUFFERS = "algorithm.", "layers.", "buffers"
_LEGACY_BUFFERS, _LEGACY_TRANSFORM = "_model_buffers", "_transform"


def encode(state: ClientState) -> dict[str, Any]:
    """The tree as named arrays."""
    out = {f"{_ALGORITHM}{k}": v for k, v in (state.algorithm or {}).items()}
    for i, slot in enumerate(state.layers):
        out.update({f"{_LAYERS}{i}.{k}": v for k, v in (slot or {}).items()})
    if state.buffers is not None:
        out[_BUFFERS] = state.buffers
    return out


def decode(named: dict[str, Any] | None, stack: Any) -> ClientState:
    """The tree of a stored state (None: the client never trained) for a run's ``stack``."""
    n = len(stack.layers)
    if not named:
        return ClientState(None, (None,) * n, None)
    if not any(k.startswith((_ALGORITHM, _LAYERS)) or k == _BUFFERS for k in named):
        return _legacy(named, stack)
    algorithm: dict = {}
    layers: list[dict] = [{} for _ in range(n)]
    for key, value in named.items():
        if key.startswith(_ALGORITHM):
            algorithm[key[len(_ALGORITHM):]] = value
        elif key.startswith(_LAYERS):
            index, _, name = key[len(_LAYERS):].partition(".")
            layers[int(index)][name] = value
    return ClientState(algorithm or None, tuple(s or None for s in layers),
                       named.get(_BUFFERS))


def _legacy(named: dict[str, Any], stack: Any) -> ClientState:
    """A rayfl 0.1 state: transform i's entries were ``_transform{i}_{name}`` (transforms came
    after no other layer then), the buffers ``_model_buffers``."""
    algorithm: dict = {}
    layers: list[dict] = [{} for _ in stack.layers]
    transforms = [i for i, kind in enumerate(stack.kinds) if kind == "transform"]
    for key, value in named.items():
        if key == _LEGACY_BUFFERS:
            continue
        if key.startswith(_LEGACY_TRANSFORM):
            index, _, name = key[len(_LEGACY_TRANSFORM):].partition("_")
            layers[transforms[int(index)]][name] = value
        else:
            algorithm[key] = value
    return ClientState(algorithm or None, tuple(s or None for s in layers),
                       named.get(_LEGACY_BUFFERS))
