"""Local training of one virtual client on flat vectors: the loop every algorithm shares.

The loop knows nothing about models or algorithms: it asks ``grad_fn(point, batch_idx)`` for a
minibatch loss and flat gradient, lets the algorithm's :class:`LocalRule` pick the gradient point
and correct the direction, and applies the local optimizer. Minibatch order comes from a
generator keyed by (seed, round, client).

One step, in torch's order (a plain model gives exactly ``clip_grad_norm_`` followed by
``torch.optim.SGD(momentum, weight_decay)`` or ``torch.optim.Adam(weight_decay)``):

1. g = ∇f_i(rule.grad_point(y)) on the minibatch (the loss gradient only);
2. clipping (``clip_norm`` c): g ← g · min(1, c / (‖g‖ + 1e-6)), ``clip_grad_norm_``'s rule;
3. weight decay at the iterate: g ← g + wd · y (what both torch optimisers do to ``.grad``);
4. the algorithm's correction: d = rule.direction(g, y) (e.g. SCAFFOLD's g + c − c_i), as if it
   were added to ``.grad`` after clipping, so clipping never rescales it;
5. the optimiser on d: SGD with heavy-ball momentum (buf ← ρ buf + d, y ← y − η buf; buffer
   starts empty every round) or Adam (bias-corrected moments of d, fresh every round).
Which algorithms accept Adam (and why the others cannot) is decided in their ``check_config``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from rayfl.algorithms.base import LocalRule, Vec

# (point, minibatch indices: an index array, or on a GPU an index tensor on the device)
GradFn = Callable[[Vec, "np.ndarray | torch.Tensor"], tuple[torch.Tensor, Vec]]


@dataclass(frozen=True)
class LocalSpec:
    """The local optimiser settings of one round (resolved from ``local.*`` config)."""

    epochs: int = 1
    steps: int | None = None  # fixed local steps instead of epochs
    batch_size: int = 50
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = None
    optimizer: str = "sgd"  # sgd | adam
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8

    def num_steps(self, n: int) -> int:
        """K_i: local steps a client with ``n`` samples runs in a full round."""
        if self.steps is not None:
            return self.steps
        return self.epochs * math.ceil(n / self.batch_size)


def batch_schedule(n: int, spec: LocalSpec, rng: np.random.Generator, max_steps: int | None):
    """Yield the index arrays of every minibatch (reshuffled each epoch), at most ``max_steps``."""
    total = spec.num_steps(n)
    if max_steps is not None:
        total = min(total, max_steps)
    per_epoch = math.ceil(n / spec.batch_size)
    done = 0
    while done < total:
        perm = rng.permutation(n)
        for b in range(per_epoch):
            if done >= total:
                return
            yield perm[b * spec.batch_size:(b + 1) * spec.batch_size]
            done += 1


def device_schedule(n: int, spec: LocalSpec, rng: np.random.Generator, max_steps: int | None,
                    device: torch.device):
    """:func:`batch_schedule`'s minibatches for a client whose rows live on ``device``: on the
    CPU the index arrays themselves; elsewhere :func:`uploaded` (a copy from host memory each
    step would wait for the GPU every step)."""
    if device.type == "cpu":
        return batch_schedule(n, spec, rng, max_steps)
    return uploaded(list(batch_schedule(n, spec, rng, max_steps)), device)


def uploaded(batches: list[np.ndarray], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Index arrays as tensors on ``device``, views of one tensor copied there in one go."""
    if not batches:
        return ()
    flat = torch.from_numpy(np.concatenate(batches)).to(device)
    return torch.split(flat, [len(b) for b in batches])


class DeviceIndices:
    """A client's minibatch indices as tensors on the device of its rows. A tensor is taken as
    given; on the CPU an array is wrapped (no copy). On a GPU, an array that is a slice of one
    permutation (:func:`batch_schedule`'s epoch order, which :meth:`LocalContext.batches`
    yields) is cut from one upload of that permutation, so a step waits for no copy; any other
    array is copied on its own."""

    def __init__(self, device: torch.device):
        self.device = device
        self.base: np.ndarray | None = None  # the permutation uploaded last (kept referenced)
        self.uploaded: torch.Tensor | None = None

    def __call__(self, idx) -> torch.Tensor:
        if isinstance(idx, torch.Tensor):
            return idx.to(self.device)
        if self.device.type == "cpu":
            return torch.from_numpy(idx)
        base = idx.base
        if not (isinstance(base, np.ndarray) and base.ndim == idx.ndim == 1
                and base.dtype == idx.dtype and base.strides == idx.strides):
            return torch.from_numpy(idx).to(self.device)
        if base is not self.base:
            self.base, self.uploaded = base, torch.from_numpy(base).to(self.device)
        start = (idx.__array_interface__["data"][0]
                 - base.__array_interface__["data"][0]) // idx.itemsize
        return self.uploaded[start:start + len(idx)]


CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def clip_by_norm(g: Vec, max_norm: float) -> Vec:
    """``g`` scaled by min(1, max_norm / (‖g‖ + 1e-6)), as ``torch.nn.utils.clip_grad_norm_``."""
    norm = torch.linalg.vector_norm(g)
    return g * torch.clamp(max_norm / (norm + CLIP_EPS), max=1.0)


class LocalOptimizer:
    """The local optimiser of one client's round, steps 2–5 above: clipping, weight decay, the
    algorithm's correction, then SGD with heavy-ball momentum or Adam (state fresh each round).
    Client procedures step their own iterates with it (:meth:`LocalContext.optimizer`)."""

    def __init__(self, spec: LocalSpec, lr: float, like: Vec):
        self.spec, self.lr, self.steps = spec, lr, 0
        self.buf = torch.zeros_like(like) if spec.momentum > 0 or spec.optimizer == "adam" \
            else None
        self.sq = torch.zeros_like(like) if spec.optimizer == "adam" else None

    def step(self, y: Vec, g: Vec, rule: LocalRule | None = None) -> Vec:
        """Update ``y`` in place from the loss gradient ``g`` (taken at ``rule.grad_point(y)``)."""
        spec, lr = self.spec, self.lr
        if spec.clip_norm is not None:
            g = clip_by_norm(g, spec.clip_norm)
        if spec.weight_decay:
            g = g.add(y, alpha=spec.weight_decay)
        d = g if rule is None else rule.direction(g, y, lr)
        self.steps += 1
        if spec.optimizer == "adam":
            b1, b2 = spec.adam_betas
            self.buf.mul_(b1).add_(d, alpha=1 - b1)
            self.sq.mul_(b2).addcmul_(d, d, value=1 - b2)
            m_hat = self.buf / (1 - b1**self.steps)
            v_hat = self.sq / (1 - b2**self.steps)
            y.addcdiv_(m_hat, v_hat.sqrt_().add_(spec.adam_eps), value=-lr)
        elif self.buf is not None:
            self.buf.mul_(spec.momentum).add_(d)
            y.add_(self.buf, alpha=-lr)
        else:
            y.add_(d, alpha=-lr)
        return y


def train_client(rule: LocalRule, y0: Vec, grad_fn: GradFn, n: int, spec: LocalSpec, lr: float,
                 rng: np.random.Generator, max_steps: int | None = None) -> tuple[Vec, int, float]:
    """Run local training from ``y0``; returns (final iterate y, steps run K_i, sum of the
    steps' losses)."""
    y = y0.clone()
    opt = LocalOptimizer(spec, lr, y)
    # float64 sums of the float32 losses: a Python float on the CPU (the same sum), on a GPU
    # a device scalar (reading the loss back each step would wait for the GPU)
    on_cpu = y.device.type == "cpu"
    loss_sum = 0.0 if on_cpu else torch.zeros((), dtype=torch.float64, device=y.device)
    for idx in device_schedule(n, spec, rng, max_steps, y.device):
        loss, g = grad_fn(rule.grad_point(y), idx)
        opt.step(y, g, rule)
        loss_sum += float(loss) if on_cpu else loss.detach()
    return y, opt.steps, float(loss_sum)


def spec_from_config(local) -> LocalSpec:
    """The :class:`LocalSpec` of a ``local.*`` config section."""
    return LocalSpec(epochs=local.epochs, steps=local.steps, batch_size=local.batch_size,
                     momentum=local.momentum, weight_decay=local.weight_decay,
                     clip_norm=local.clip_norm, optimizer=local.optimizer)
