"""Model zoo: each builder takes (input_shape, num_classes) and returns an ``nn.Module``."""

from __future__ import annotations

import math

from torch import nn


def logreg(input_shape, num_classes) -> nn.Module:
    """Multinomial logistic regression on the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def mlp(input_shape, num_classes, hidden=(100, 100)) -> nn.Module:
    """Fully connected ReLU network (AdaBest: 2×100; fedmsi: 1×128)."""
    layers, width = [nn.Flatten()], math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def fmnist_cnn(input_shape, num_classes) -> nn.Module:
    """The IMA paper's FMNIST CNN (Table IV): conv5-32, pool, conv5-32, pool, FC 512-384-128-C."""
    c, h, w = input_shape
    side = ((h - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(c, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * side * side, 384), nn.ReLU(),
        nn.Linear(384, 128),
        nn.Linear(128, num_classes),
    )
