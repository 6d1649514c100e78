"""Models by config name; see :mod:`rayfl.models.zoo`."""

from __future__ import annotations

from rayfl.models import zoo
from rayfl.models.flat import FlatModel, sha256_of

MODELS = {
    "logreg": zoo.logreg,
    "mlp": zoo.mlp,
    "fmnist_cnn": zoo.fmnist_cnn,
}


def build_model(name: str, input_shape, num_classes: int, **kwargs):
    """Instantiate a zoo model by name."""
    return MODELS[name](tuple(input_shape), num_classes, **kwargs)


__all__ = ["MODELS", "build_model", "FlatModel", "sha256_of"]
