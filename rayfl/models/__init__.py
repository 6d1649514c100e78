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

from rayfl import registry
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
    try:
        model = builder(tuple(handle.input_shape), handle.num_classes, **kwargs)
    except (ValueError, TypeError, RuntimeError, IndexError) as e:
        raise ConfigError("model.name", name, _takes(handle, e)) from None
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
    from torch import nn

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


def _takes(handle, error: Exception) -> str:
    what = " ".join(str(error).split())[:200]
    return (f"a model that takes this dataset's inputs (shape {tuple(handle.input_shape)}, "
            f"{handle.num_classes} classes; building or running it failed: "
            f"{type(error).__name__}: {what})")


def check_fits(model_cfg, handle):
    """Pre-flight: the model builds for the data behind ``handle`` and maps a batch of two of
    its inputs to one score per class (per position, for next-token labels) — a ConfigError
    naming ``model.name`` otherwise; returns the model."""
    import torch

    model = build_for(model_cfg, handle)
    if handle.kind == "ids":
        return model
    dtype = torch.long if handle.kind == "tokens" else torch.float32
    expected = (2, handle.num_classes) + ((handle.label_len,) if handle.label_len else ())
    try:
        with torch.no_grad():
            out = model.eval()(torch.zeros((2, *handle.input_shape), dtype=dtype))
    except (ValueError, TypeError, RuntimeError, IndexError) as e:
        raise ConfigError("model.name", model_cfg.name, _takes(handle, e)) from None
    if tuple(out.shape) != expected:
        raise ConfigError("model.name", model_cfg.name, _takes(handle, ValueError(
            f"output shape {tuple(out.shape)} for a batch of 2")))
    return model


def check_single_rows(model, handle, batch_size: int) -> None:
    """Pre-flight: when some client's last minibatch holds one row (n_i mod B = 1), the model
    must train on a single sample — BatchNorm over features cannot (torch raises); a
    ConfigError naming ``local.batch_size`` and the nearest sizes that work, instead of a
    failure in the middle of a run."""
    import numpy as np
    import torch

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
    import numpy as np

    last = np.where(sizes % batch_size == 0, batch_size, sizes % batch_size)
    return (sizes > 0) & (last == 1)


def _sizes_that_work(sizes, batch_size: int) -> str:
    """The nearest batch sizes below and above ``batch_size`` that leave no client a one-row
    last minibatch (above the largest client every size does, unless a client has one row)."""
    import numpy as np

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


__all__ = ["build_model", "build_for", "check_fits", "check_single_rows", "rec_metrics", "FlatModel", "sha256_of"]
