"""Model zoo: each builder takes (input_shape, num_classes) and returns an ``nn.Module``.

ReLUs work in place, and the CNNs max-pool before their ReLU: max-pooling and ReLU commute
(ReLU is monotone), so conv → pool → ReLU computes the papers' conv → ReLU → pool, outputs and
gradients, bit for bit, with the ReLU on a quarter of the values."""

from __future__ import annotations

import math

from torch import nn

from rayfl.deferred import deferred

models = deferred("torchvision.models")


def logreg(input_shape, num_classes) -> nn.Module:
    """Multinomial logistic regression on the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def mlp(input_shape, num_classes, hidden=(100, 100)) -> nn.Module:
    """Fully connected ReLU network (AdaBest: 2×100; fedmsi: 1×128)."""
    layers, width = [nn.Flatten()], math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def _two_conv(input_shape, num_classes, channels: int, fc: tuple[int, int]) -> nn.Module:
    """conv5-k, pool, conv5-k, pool, FC fc[0], FC fc[1], FC C — ReLU after every hidden layer
    (after the pooling, which it commutes with)."""
    c, h, _ = input_shape
    side = ((h - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(c, channels, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Conv2d(channels, channels, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(channels * side * side, fc[0]), nn.ReLU(inplace=True),
        nn.Linear(fc[0], fc[1]), nn.ReLU(inplace=True),
        nn.Linear(fc[1], num_classes),
    )


def fmnist_cnn(input_shape, num_classes) -> nn.Module:
    """The IMA paper's FMNIST CNN (Table IV; ReLU after FC 128 as in the authors' code):
    conv5-32, pool, conv5-32, pool, FC 512-384-128-C."""
    return _two_conv(input_shape, num_classes, 32, (384, 128))


def cifar_cnn(input_shape, num_classes) -> nn.Module:
    """The IMA paper's CIFAR CNN (Table IV): conv5-64, pool, conv5-64, pool, FC 1600-384-128-C."""
    return _two_conv(input_shape, num_classes, 64, (384, 128))


def adabest_cnn(input_shape, num_classes) -> nn.Module:
    """AdaBest's (= FedDyn's) CIFAR CNN: conv5-64, pool, conv5-64, pool, FC 1600-384-192-C."""
    return _two_conv(input_shape, num_classes, 64, (384, 192))


def lenet5(input_shape, num_classes) -> nn.Module:
    """LeNet-5 (LeCun et al. 1998) with ReLU and max-pooling: conv5-6, pool, conv5-16, pool,
    FC 120-84-C (FEMNIST in FedEve). Inputs smaller than LeNet's 32×32 are zero-padded to it."""
    c, h, _ = input_shape
    pad = max(0, (32 - h) // 2)
    side = ((h + 2 * pad - 4) // 2 - 4) // 2
    return nn.Sequential(
        nn.Conv2d(c, 6, 5, padding=pad), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Conv2d(6, 16, 5), nn.MaxPool2d(2), nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(16 * side * side, 120), nn.ReLU(inplace=True),
        nn.Linear(120, 84), nn.ReLU(inplace=True),
        nn.Linear(84, num_classes),
    )


def resnet18_gn(input_shape, num_classes, groups: int = 2) -> nn.Module:
    """torchvision's ResNet-18 with every BatchNorm replaced by GroupNorm(``groups``) (IMA: two
    groups; FedEve, FedMIM); the first conv takes the input's channels."""
    net = models.resnet18(weights=None, num_classes=num_classes,
                          norm_layer=lambda ch: nn.GroupNorm(groups, ch))
    if input_shape[0] != 3:
        net.conv1 = nn.Conv2d(input_shape[0], 64, 7, stride=2, padding=3, bias=False)
    return net
