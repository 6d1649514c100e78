"""``model.*``: the network (see ``rayfl.models``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from rayfl import registry
from rayfl.schema import ConfigError, field


@dataclass(frozen=True)
class ModelConfig(registry.Named):
    """Which network clients train (see ``rayfl.models``)."""

    KIND = "model"

    name: str = field("fmnist_cnn", doc="model: a built-in (listed under `model.name` below) "
                                        "or package.module:Name, a builder (input_shape, "
                                        "num_classes, **params) -> torch.nn.Module")
    hidden: Optional[list[int]] = field(None, doc="hidden widths for mlp (default 100,100)")
    groups: int = field(2, doc="GroupNorm groups in resnet18_gn (IMA: 2); must divide 64", lo=1)
    embedding_dim: int = field(32, doc="ncf: user/item embedding width", lo=1, hi=2**16)
    channels_last: bool = field(True, doc="convolution weights and activations in channels-last "
                                "(NHWC) layout: faster convolutions on CPU and GPU, the same "
                                "math (float rounding differs from false)")
    projection: Optional[int] = field(
        None, doc="MOON's projection head (Li, He & Song, CVPR 2021): the classifier (the last "
                  "nn.Linear, d → C) becomes Linear(d, d)–ReLU–Linear(d, projection)–"
                  "Linear(projection, C), so the representation `repr` is the projection's "
                  "output; dense-input models only; null: the model as built", lo=1, hi=2**16)
    params: Any = field(None, doc="validated Params of the chosen model", flatten=True)

    def check(self, prefix: str) -> None:
        if self.hidden is not None and (not self.hidden or min(self.hidden) < 1 or
                                        max(self.hidden) > 2**16):
            raise ConfigError(f"{prefix}.hidden", self.hidden, "a non-empty list of widths in "
                              "[1, 65536]")
        if 64 % self.groups:
            raise ConfigError(f"{prefix}.groups", self.groups, "a divisor of 64 (ResNet-18's "
                              "narrowest layer)")
