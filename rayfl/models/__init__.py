"""Models by config name (:mod:`rayfl.registry`); built-ins in :mod:`~rayfl.models.zoo` and
:mod:`~rayfl.models.rec`.

A model is a builder ``(input_shape, num_classes, **options) -> torch.nn.Module`` (a function or
an ``nn.Module`` class). It receives the options it names among ``hidden``, ``groups``,
``embedding_dim`` and ``vocab``, and every field of its own ``Params`` (its ``model.*`` keys).
``takes_ids = True`` marks a model that embeds integer ids (data kind "ids") instead of reading
dense inputs; ``takes_tokens = True`` one that reads token sequences (data kind "tokens", text),
which also receives ``per_token``: true when the data has one label per position (logits
(N, C, T)), false for one label per row (logits (N, C) from the last position).
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import torch
from torch import nn

from rayfl import registry
from rayfl.contract import ComponentError, Lent, calling, describe, name_of, user_frames
from rayfl.models.flat import FlatModel, sha256_of
from rayfl.models.rec import rec_metrics
from rayfl.schema import ConfigError

SEQUENCE = ("shakespeare_lstm", "stackoverflow_lstm", "transformer_lm")  # built-in token models


def build_model(name: str, input_shape, num_classes: int, **kwargs):
    """Instantiate a model by name (built-in, registered or package.module:Name)."""
    return registry.resolve("model", name)(tuple(input_shape), num_classes, **kwargs)


def build_for(model_cfg, handle):
    """The ``model.*`` network for the data behind ``handle`` (shapes, classes, id vocabulary);
    a ConfigError when the model cannot read that data."""
    name = model_cfg.name
    builder = registry.resolve("model", name)
    takes = "ids" if getattr(builder, "takes_ids", False) else \
        "tokens" if getattr(builder, "takes_tokens", False) else "dense"
    if takes != handle.kind:
        need = {"ids": "an id model (ncf)", "tokens": f"a sequence model ({', '.join(SEQUENCE)})",
                "dense": "a model for dense inputs"}[handle.kind]
        raise ConfigError("model.name", name, f"{need} for this dataset ({handle.kind} inputs)")
    signature = inspect.signature(builder).parameters
    if getattr(handle, "label_len", 0) and "per_token" not in signature:
        raise ConfigError("model.name", name, "a model with per-token outputs (a builder taking "
                          "per_token) for this dataset's one label per position")
    options = {"hidden": tuple(model_cfg.hidden) if model_cfg.hidden else None,
               "groups": model_cfg.groups, "embedding_dim": model_cfg.embedding_dim,
               "vocab": tuple(handle.vocab), "per_token": bool(getattr(handle, "label_len", 0))}
    kwargs = {k: v for k, v in options.items() if v is not None and k in signature}
    if model_cfg.params is not None:
        kwargs.update({f.name: getattr(model_cfg.params, f.name)
                       for f in dataclasses.fields(model_cfg.params)})
    with calling(name_of(builder)):  # a built-in's failure the data's shapes explain: the key
        try:
            model = builder(tuple(handle.input_shape), handle.num_classes, **kwargs)
        except _DATA_ERRORS as e:
            if not registry.is_builtin("model", name):  # the user's own error, with its frames
                raise ComponentError(name_of(builder), f"raised {type(e).__name__}: {e} "
                                     f"(building it for inputs of shape "
                                     f"{tuple(handle.input_shape)}, {handle.num_classes} "
                                     "classes)", frames=user_frames(e.__traceback__)) from None
            raise ConfigError("model.name", name, _takes(handle, e)) from None
    check_module(model, builder)
    if model_cfg.projection is not None:
        if handle.kind != "dense":
            raise ConfigError("model.projection", model_cfg.projection,
                              f"null for {handle.kind} inputs (the projection head sits before "
                              "a dense model's classifier)")
        add_projection_head(model, model_cfg.projection)
    return model


def add_projection_head(model, dim: int):
    """Replace ``model``'s classifier (its last ``nn.Linear``, d → C) by MOON's projection head
    and output layer: Linear(d, d), ReLU, Linear(d, ``dim``), then Linear(``dim``, C)."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigError("model.projection", dim, "null for a model without an nn.Linear "
                                                   "classifier")
    parent_name, _, attr = linears[-1].rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    head = getattr(parent, attr)
    d, classes = head.in_features, head.out_features
    setattr(parent, attr, nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, dim),
                                        nn.Linear(dim, classes)))
    return model


#: what a model raises when the data's shapes or ids do not fit it (a config mismatch, named
#: by ``model.name``); anything else it raises is its own failure (a ComponentError)
_DATA_ERRORS = (ValueError, TypeError, RuntimeError, IndexError)
REAL_ROWS = 4  # rows of a real batch the pre-flight runs the model on


def _takes(handle, error: Exception | str) -> str:
    what = " ".join(str(error).split())[:200]
    if isinstance(error, Exception):
        what = f"{type(error).__name__}: {what}"
    return (f"a model that takes this dataset's inputs (shape {tuple(handle.input_shape)}, "
            f"{handle.num_classes} classes; building or running it failed: {what})")


def check_module(model, builder) -> None:
    """What a model builder returns is an ``nn.Module`` with trainable parameters (rayfl trains
    and averages them): a ComponentError naming the builder otherwise."""
    if not isinstance(model, nn.Module):
        raise ComponentError(name_of(builder), f"returned {describe(model)}; expected a "
                             "torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise ComponentError(name_of(builder), f"returned a {type(model).__name__} with no "
                             "trainable parameters; rayfl trains and averages a model's "
                             "parameters")
    for name, p in [*model.named_parameters(), *model.named_buffers()]:
        if p.is_meta:
            raise ComponentError(name_of(builder), f"returned a {type(model).__name__} whose "
                                 f"{name} is on the meta device (no values); expected a model "
                                 "with real tensors on the CPU (rayfl places it)")
        if p.is_complex():
            raise ComponentError(name_of(builder), f"returned a {type(model).__name__} whose "
                                 f"{name} is {describe(p)}; expected real floating-point "
                                 "parameters (rayfl trains them as one real vector)")


def check_fits(model_cfg, handle):
    """Pre-flight: the model builds for the data behind ``handle`` and maps a batch of two of
    its inputs, then (a user's model) a real batch (the first rows of the first client that has
    any), to one finite score per class (per position, for next-token labels) — a ConfigError naming
    ``model.name`` when its shapes do not fit the data, a ComponentError naming the user's
    model when it breaks its contract (a tuple, non-finite scores); returns the model."""
    model = build_for(model_cfg, handle)
    if handle.kind != "ids":
        dtype = torch.long if handle.kind == "tokens" else torch.float32
        _check_scores(model_cfg, model, handle, torch.zeros((2, *handle.input_shape),
                                                            dtype=dtype), "a batch of 2")
    if registry.is_builtin("model", model_cfg.name):
        return model  # a built-in reads no data here: the driver may not hold the partition
    real = _real_batch(handle)
    if real is not None:
        _check_scores(model_cfg, model, handle, *real)
        _check_gradient(model_cfg, model, *real)
    return model


def _real_batch(handle):
    """The first rows of the first client that has any, on the CPU, and what they are; None
    when no client has rows."""
    nonempty = np.flatnonzero(handle.sizes())
    if not len(nonempty):
        return None
    reader, client = handle.open(), int(nonempty[0])
    x, y = reader.client(client)
    batch, _ = reader.tensors(x[:REAL_ROWS], y[:REAL_ROWS], "cpu")
    return batch, f"a real batch ({len(batch)} rows of client {client})"


def _check_gradient(model_cfg, model, batch, what: str) -> None:
    """The scores depend on the model's trainable parameters (a gradient reaches them): a
    ComponentError naming the model's forward when none does (parameters used detached)."""
    forward = _forward_name(model, registry.resolve("model", model_cfg.name))
    with torch.enable_grad(), calling(forward):
        out = model.eval()(batch)
    if not out.requires_grad:
        raise ComponentError(forward, f"returned scores for {what} that no trainable parameter "
                             "reaches (a gradient cannot train it: are its parameters used "
                             "detached, or under torch.no_grad?)")


def _check_scores(model_cfg, model, handle, batch, what: str) -> None:
    """The model maps ``batch`` to a float tensor of one score per class (and position), finite
    where the batch is: a ConfigError naming ``model.name`` for a shape the data does not fit,
    a ComponentError naming the model's forward for a broken contract."""
    forward = _forward_name(model, registry.resolve("model", model_cfg.name))
    expected = (len(batch), handle.num_classes) + ((handle.label_len,) if handle.label_len
                                                   else ())
    lent = Lent().add("its input", batch)  # evaluation lends the server's test set
    with torch.no_grad(), calling(forward):
        try:
            out = model.eval()(batch)
        except _DATA_ERRORS as e:
            raise ConfigError("model.name", model_cfg.name, _takes(handle, e)) from None
    lent.check(forward)
    if not isinstance(out, torch.Tensor):
        raise ComponentError(forward, f"returned {describe(out)} for {what}; expected one "
                             f"tensor of scores of shape {expected}")
    if tuple(out.shape) != expected:
        shape = f"output shape {tuple(out.shape)} for {what}, not {expected}"
        if registry.is_builtin("model", model_cfg.name):  # a built-in on data it cannot read
            raise ConfigError("model.name", model_cfg.name, _takes(handle, shape))
        raise ComponentError(forward, f"returned scores of shape {tuple(out.shape)} for {what}; "
                             f"expected {expected}: one per class of the data "
                             f"({handle.num_classes}, given to the builder as num_classes)" +
                             (" and position" if handle.label_len else ""))
    if not out.is_floating_point():
        raise ComponentError(forward, f"returned {describe(out)} for {what}; expected floating-"
                             "point scores")
    finite_input = not batch.is_floating_point() or bool(torch.isfinite(batch).all())
    if finite_input and not bool(torch.isfinite(out).all()):  # NaN data: the data's checks
        raise ComponentError(forward, f"returned non-finite scores (NaN or inf) for {what}")


def _forward_name(model, builder) -> str:
    """``module:Class.forward`` of a user's model class; for a torch container a builder
    returned, the builder and the container's forward."""
    if type(model).__module__.startswith("torch."):
        return f"{name_of(builder)} ({type(model).__name__}.forward)"
    return name_of(model, "forward")


def check_single_rows(model, handle, batch_size: int) -> None:
    """Pre-flight: when some client's last minibatch holds one row (n_i mod B = 1), the model
    must train on a single sample — BatchNorm over features cannot (torch raises); a
    ConfigError naming ``local.batch_size`` and the nearest sizes that work, instead of a
    failure in the middle of a run."""
    if handle.kind == "ids":
        return
    dtype = torch.long if handle.kind == "tokens" else torch.float32
    try:
        model.train()(torch.zeros((1, *handle.input_shape), dtype=dtype))
        return  # trains on one sample: no client's partition matters
    except ValueError as e:
        reason = " ".join(str(e).split())
    sizes = handle.sizes()
    single = np.flatnonzero(_last_batch_is_one_row(sizes, batch_size))
    if len(single):
        c = int(single[0])
        raise ConfigError("local.batch_size", batch_size,
                          f"a size that leaves no client a last minibatch of one row: the model "
                          f"cannot train on one sample ({reason}); "
                          f"{len(single)} clients would, e.g. client {c} with {sizes[c]} rows; "
                          f"{_sizes_that_work(sizes, batch_size)}")


def _last_batch_is_one_row(sizes, batch_size: int):
    """Per client: whether its epoch ends on a minibatch of one row."""
    last = np.where(sizes % batch_size == 0, batch_size, sizes % batch_size)
    return (sizes > 0) & (last == 1)


def _sizes_that_work(sizes, batch_size: int) -> str:
    """The nearest batch sizes below and above ``batch_size`` that leave no client a one-row
    last minibatch (above the largest client every size does, unless a client has one row)."""
    distinct = np.unique(sizes[sizes > 0])
    if (distinct == 1).any():
        return ("no batch size does: a client holds a single row (raise data.min_samples or "
                "change the partition)")
    works = [b for b in (_nearest(distinct, range(batch_size - 1, 1, -1)),
                         _nearest(distinct, range(batch_size + 1, int(distinct.max()) + 2)))
             if b is not None]
    return "batch size " + " or ".join(map(str, works)) + " leaves none"


def _nearest(sizes, candidates) -> int | None:
    """The first candidate batch size that leaves no client a one-row last minibatch."""
    return next((b for b in candidates if not _last_batch_is_one_row(sizes, b).any()), None)


__all__ = ["build_model", "build_for", "check_fits", "check_single_rows", "rec_metrics",
           "FlatModel", "sha256_of"]
