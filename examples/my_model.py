"""A custom torch model: a two-layer perceptron whose width is its own config key.

Run it: ``rayfl run configs/test/tiny.yaml model.name=examples.my_model:TinyMLP model.width=16``
"""

import math
from dataclasses import dataclass

from torch import nn

from rayfl import schema


class TinyMLP(nn.Module):
    """Flatten, Linear(width), tanh, Linear(classes)."""

    @dataclass(frozen=True)
    class Params:
        width: int = schema.field(32, doc="hidden units", lo=1)

    def __init__(self, input_shape, num_classes, width=32):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width),
                                 nn.Tanh(), nn.Linear(width, num_classes))

    def forward(self, x):
        return self.net(x)
