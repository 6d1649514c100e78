"""Models by config name; see :mod:`rayfl.models.zoo` and :mod:`rayfl.models.rec`."""

from __future__ import annotations

import inspect

from rayfl.models import rec, zoo
from rayfl.models.flat import FlatModel, sha256_of
from rayfl.models.rec import rec_metrics
from rayfl.schema import ConfigError

MODELS = {
    "logreg": zoo.logreg,
    "mlp": zoo.mlp,
    "fmnist_cnn": zoo.fmnist_cnn,
    "cifar_cnn": zoo.cifar_cnn,
    "adabest_cnn": zoo.adabest_cnn,
    "lenet5": zoo.lenet5,
    "resnet18_gn": zoo.resnet18_gn,
    "ncf": rec.ncf,
}
ID_MODELS = ("ncf",)  # models that embed integer ids (data kind "ids") instead of dense inputs


def build_model(name: str, input_shape, num_classes: int, **kwargs):
    """Instantiate a zoo model by name."""
    return MODELS[name](tuple(input_shape), num_classes, **kwargs)


def build_for(model_cfg, handle):
    """The ``model.*`` network for the data behind ``handle`` (shapes, classes, id vocabulary);
    a ConfigError when the model cannot read that data."""
    name = model_cfg.name
    if (name in ID_MODELS) != (handle.kind == "ids"):
        need = "an id model (ncf)" if handle.kind == "ids" else "a model for dense inputs"
        raise ConfigError("model.name", name, f"{need} for this dataset ({handle.kind} inputs)")
    options = {"hidden": tuple(model_cfg.hidden) if model_cfg.hidden else None,
               "groups": model_cfg.groups, "embedding_dim": model_cfg.embedding_dim,
               "vocab": tuple(handle.vocab)}
    accepted = inspect.signature(MODELS[name]).parameters
    kwargs = {k: v for k, v in options.items() if k in accepted and v is not None}
    return build_model(name, handle.input_shape, handle.num_classes, **kwargs)


__all__ = ["MODELS", "build_model", "build_for", "rec_metrics", "FlatModel", "sha256_of"]
