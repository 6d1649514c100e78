"""Dataset loaders: each turns its on-disk format into :class:`Arrays` (nothing downloads).

A dataset is any object with ``load(data_cfg, seed) -> Arrays`` (a module or a class), named by
``data.dataset`` through :mod:`rayfl.registry`. Optional: ``Params`` (its own ``data.*`` keys,
read from ``data_cfg.params``), ``natural = True`` (rows carry writers/users),
``sources(data_cfg) -> paths`` (the files and folders it reads, which key the partition cache:
see :mod:`rayfl.data.sources`) and ``evaluator(model, point, x, y, batch_size, group) ->
metrics`` (extra test metrics, see :mod:`rayfl.data.evaluators`). What ``load`` returns is
checked by :mod:`rayfl.data.validate`.
"""

from __future__ import annotations

import os
import pickle
import struct
import zlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import numpy as np

from rayfl import registry
from rayfl.contract import ComponentError, calling, describe, expect, name_of
from rayfl.data.validate import problem
from rayfl.schema import ConfigError


@dataclass
class Arrays:
    """A centrally held dataset before partitioning.

    ``x_*`` keep their storage dtype (uint8 images stay uint8); a model sees
    ``x * scale`` as float32 reshaped to ``input_shape`` — or, for ``kind == "ids"``, the
    integer columns as int64 indices into tables of sizes ``vocab``; ``kind == "tokens"``: a
    row is a sequence of token ids < ``vocab[0]`` (text). ``groups`` (natural datasets) gives
    each training row's writer/user as 0..G-1. ``eval_group`` > 0 says the test set is ranked in
    consecutive groups of that many rows (one positive each). Labels are one class per row, or
    (next-token prediction) one per position, ``y`` of shape (n, T); ``ignore_index`` labels
    (padding) count in neither loss nor accuracy, ``unscored`` labels (out-of-vocabulary,
    begin/end of sentence) count in the loss but not in the accuracy.
    """

    x_train: np.ndarray  # (n, features)
    y_train: np.ndarray  # (n,) int
    x_test: np.ndarray
    y_test: np.ndarray
    input_shape: tuple[int, ...]
    num_classes: int
    scale: float = 1.0
    groups: Optional[np.ndarray] = None
    kind: str = "dense"
    vocab: tuple[int, ...] = ()
    eval_group: int = 0
    ignore_index: int = -100
    unscored: tuple[int, ...] = ()


# what reading a damaged or foreign file raises, whatever its format
READ_ERRORS = (OSError, EOFError, ValueError, KeyError, IndexError, TypeError, AttributeError,
               pickle.UnpicklingError, zlib.error, struct.error, UnicodeDecodeError, ImportError)


def is_rayfls(component) -> bool:
    """Whether a dataset component is rayfl's own (its errors name files and ``data.*`` keys;
    a user's name the component)."""
    return registry.identity(component).startswith("rayfl.")


def loader_name(cfg) -> str:
    """``module:Name.load`` of the configured loader, as the user named it."""
    return f"{cfg.dataset}.load" if ":" in cfg.dataset else name_of(cfg.component(), "load")


def sources(cfg) -> list[str]:
    """The files and folders the configured loader reads (its ``sources(data_cfg)``; a user's
    loader without one: ``data.root`` when set), for the partition cache key."""
    component = cfg.component()
    if getattr(component, "sources", None) is None:
        return [] if is_rayfls(component) or cfg.root is None else [cfg.root]
    if is_rayfls(component):
        return list(component.sources(cfg))
    name = loader_name(cfg).removesuffix(".load") + ".sources"
    with calling(name):
        paths = component.sources(cfg)
    expect(isinstance(paths, (list, tuple)) and all(isinstance(p, (str, os.PathLike))
                                                    for p in paths),
           name, f"returned {describe(paths)}; expected a list of file or folder paths")
    for p in paths:
        expect(os.path.exists(os.path.expanduser(p)), name,
               f"named {os.fspath(p)!r}, which does not exist")
    return [os.fspath(p) for p in paths]


def _call(cfg, seed: int) -> Arrays:
    """The loader's return value; a built-in's unreadable file is a ConfigError on ``data.root``
    naming it, a user's loader that raises is a ComponentError naming it (its own ConfigError
    passes as it is)."""
    component = cfg.component()
    if not is_rayfls(component):
        with calling(loader_name(cfg)):
            try:
                return component.load(cfg, seed)
            except ConfigError as e:  # raised past ``calling``, which would wrap it
                own = e
        raise own
    try:
        return component.load(cfg, seed)
    except ConfigError:
        raise  # the loader's own clear message
    except READ_ERRORS as e:
        where = getattr(e, "filename", None) or cfg.root
        raise ConfigError("data.root", where, f"readable {cfg.dataset} files in the documented "
                          f"format ({type(e).__name__}: {' '.join(str(e).split())[:300]})") \
            from None


def load(cfg, seed: int) -> Arrays:
    """The central dataset named by ``cfg.dataset``, checked (:mod:`rayfl.data.validate`): a
    built-in's bad file is a ConfigError on ``data.root`` that names it, a user's loader that
    breaks its contract a ComponentError naming ``module:Name.load``."""
    arrays = _call(cfg, seed)
    builtin = is_rayfls(cfg.component())
    if not isinstance(arrays, Arrays):
        found = f"returned {describe(arrays)}; expected rayfl.data.datasets.Arrays"
    else:
        found = problem(arrays, natural=cfg.stored_partition == "natural")
    if found and builtin:
        read = sources(cfg)
        where = cfg.root or (os.path.dirname(read[0]) if read else None)
        raise ConfigError("data.root", where, f"{cfg.dataset} files the loader can use "
                          f"({found})")
    if found:
        raise ComponentError(loader_name(cfg), found)
    return arrays


def require(root: str | None, paths: list[str], what: str, hint: str,
            inside: str | None = None) -> str:
    """The dataset folder (``root/inside`` when that exists), or a ConfigError on ``data.root``
    naming every expected file that is missing."""
    if root is None:
        raise ConfigError("data.root", None, f"a directory with {what} ({', '.join(paths)}); "
                          f"{hint}")
    root = os.path.expanduser(root)
    if inside and os.path.isdir(os.path.join(root, inside)):
        root = os.path.join(root, inside)
    missing = [p for p in paths if not any(os.path.exists(os.path.join(root, p + ext))
                                           for ext in ("", ".gz"))]
    if missing:
        raise ConfigError("data.root", root, f"a directory with {what} (missing: "
                          f"{', '.join(missing)}); {hint}")
    return root


def present(root: str | None, paths: list[str], inside: str | None = None) -> list[str]:
    """The files of ``paths`` (plain or ``.gz``) that exist in the folder :func:`require` would
    return (a ``sources`` helper: what is missing, the loader names)."""
    if root is None:
        return []
    root = os.path.expanduser(root)
    if inside and os.path.isdir(os.path.join(root, inside)):
        root = os.path.join(root, inside)
    return [os.path.join(root, p + ext) for p in paths for ext in ("", ".gz")
            if os.path.isfile(os.path.join(root, p + ext))]


def natural_dataset(load, name: str, doc: str, sources=None):
    """A dataset component whose rows carry their client (``partition: natural``), for a module
    that defines several: ``load`` as its loader, ``doc`` as what ``rayfl keys`` shows,
    ``sources`` the files it reads."""
    return SimpleNamespace(load=load, natural=True, sources=sources, __doc__=doc,
                           __module__=load.__module__, __qualname__=name)
