"""Sequence models over token ids (data kind "tokens"): the LEAF/FedJAX Shakespeare LSTM, the
StackOverflow next-word LSTM of Reddi et al. (ICLR 2021) and a small causal transformer.

Each reads (N, T) token ids and returns logits over the ``num_classes`` labels: (N, C) from the
last position when the data has one label per row (LEAF's next character), (N, C, T) when it
has one per position (TFF's next-token targets; ``per_token``), the shapes cross-entropy takes.
PyTorch's LSTM has two bias vectors per gate where Keras has one: 4·H more parameters a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rayfl.schema import ConfigError, field


class _LSTM(nn.Module):
    """Embedding → stacked LSTM → (optional linear projection) → linear over the labels."""

    def __init__(self, vocab: int, classes: int, embed: int, size: int, layers: int,
                 projection: int | None, per_token: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, size, num_layers=layers, batch_first=True)
        head = [nn.Linear(size, projection), nn.Linear(projection, classes)] if projection \
            else [nn.Linear(size, classes)]
        self.head = nn.Sequential(*head)
        self.per_token = per_token

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x))
        if self.per_token:
            return self.head(h).transpose(1, 2)
        return self.head(h[:, -1])


@dataclass(frozen=True)
class ShakespeareLSTMParams:
    """The Shakespeare LSTM's widths (LEAF, FedJAX, Reddi et al.: 8, 256, 2)."""

    embed: int = field(8, doc="shakespeare_lstm: character embedding width", lo=1, hi=2**16)
    lstm_size: int = field(256, doc="shakespeare_lstm: units of each LSTM layer", lo=1,
                           hi=2**16)
    lstm_layers: int = field(2, doc="shakespeare_lstm: stacked LSTM layers", lo=1, hi=16)


def shakespeare_lstm(input_shape, num_classes, *, vocab, per_token: bool = False, embed: int = 8,
                     lstm_size: int = 256, lstm_layers: int = 2) -> nn.Module:
    """The LEAF/FedJAX Shakespeare next-character LSTM: embedding 8, two LSTM layers of 256, a
    softmax over the vocabulary."""
    return _LSTM(vocab[0], num_classes, embed, lstm_size, lstm_layers, None, per_token)


shakespeare_lstm.Params = ShakespeareLSTMParams
shakespeare_lstm.takes_tokens = True


@dataclass(frozen=True)
class StackOverflowLSTMParams:
    """The StackOverflow LSTM's widths (Reddi et al. 2021: 96, 670, 96)."""

    embed: int = field(96, doc="stackoverflow_lstm: word embedding width", lo=1, hi=2**16)
    lstm_size: int = field(670, doc="stackoverflow_lstm: LSTM units", lo=1, hi=2**16)
    projection: int = field(96, doc="stackoverflow_lstm: width of the dense layer between the "
                                    "LSTM and the output layer", lo=1, hi=2**16)


def stackoverflow_lstm(input_shape, num_classes, *, vocab, per_token: bool = False,
                       embed: int = 96, lstm_size: int = 670,
                       projection: int = 96) -> nn.Module:
    """Reddi et al.'s StackOverflow next-word LSTM (ICLR 2021; TFF's): embedding 96, one LSTM of
    670, dense 96, a softmax over the 10,000 words and 4 special tokens."""
    return _LSTM(vocab[0], num_classes, embed, lstm_size, 1, projection, per_token)


stackoverflow_lstm.Params = StackOverflowLSTMParams
stackoverflow_lstm.takes_tokens = True


class _Transformer(nn.Module):
    """Token and learned position embeddings, pre-norm causal encoder layers, a linear head."""

    def __init__(self, vocab: int, classes: int, length: int, d_model: int, layers: int,
                 heads: int, ff: int, per_token: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(length, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, classes)
        self.per_token = per_token
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(length),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.embed(x) + self.position.weight[:t]
        h = self.norm(self.blocks(h, mask=self.mask[:t, :t], is_causal=True))
        if self.per_token:
            return self.head(h).transpose(1, 2)
        return self.head(h[:, -1])


@dataclass(frozen=True)
class TransformerParams:
    """The causal transformer's size."""

    d_model: int = field(128, doc="transformer_lm: embedding and residual width", lo=1,
                         hi=2**16)
    layers: int = field(2, doc="transformer_lm: encoder layers (causal self-attention)", lo=1,
                        hi=64)
    heads: int = field(4, doc="transformer_lm: attention heads; must divide d_model", lo=1,
                       hi=256)
    ff: int = field(512, doc="transformer_lm: feed-forward width", lo=1, hi=2**18)


def _check_transformer(section, prefix: str) -> None:
    p = section.params
    if p.d_model % p.heads:
        raise ConfigError(f"{prefix}.heads", p.heads, f"a divisor of model.d_model = {p.d_model}")


def transformer_lm(input_shape, num_classes, *, vocab, per_token: bool = False, d_model: int = 128,
                   layers: int = 2, heads: int = 4, ff: int = 512) -> nn.Module:
    """A small causal transformer language model (pre-norm, learned positions, no dropout): each
    position attends to itself and the positions before it."""
    return _Transformer(vocab[0], num_classes, input_shape[0], d_model, layers, heads, ff,
                        per_token)


transformer_lm.Params = TransformerParams
transformer_lm.takes_tokens = True
transformer_lm.check_section = _check_transformer
