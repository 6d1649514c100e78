"""What a client procedure sees: one client's round as a :class:`LocalContext`.

An algorithm that defines ``client_train(task, ctx)`` owns its client's local loop (MOON's
contrastive term, SAM's second gradient, Ditto's personal model); the runtime hands it this
context and keeps everything else: which rows, in which seeded order, on which device, how the
result is summed. The model is a function of a flat parameter vector: ``ctx.loss_grad(w, b)``
is the loss and flat gradient at *any* point ``w`` on minibatch ``b``; ``ctx.outputs(w, b,
features)`` gives logits and named intermediate outputs to build any loss from, and
``ctx.backward(loss)`` its flat gradient. Minibatches come from ``ctx.batches()`` in the order
the flat-vector path uses (a generator keyed by seed, round and client); ``ctx.optimizer()`` is
the configured local optimiser (clipping, weight decay, momentum or Adam). ``ctx.train(rule)``
runs the whole local loop on flat vectors under a :class:`~rayfl.algorithms.base.LocalRule` (the
fast path: SCAFFOLD, FedDyn, FedProx are a rule and a few lines around it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from rayfl.algorithms.base import PLAIN_SGD, ClientTask, LocalRule, Vec
from rayfl.contract import ComponentError
from rayfl.runtime.local import (DeviceIndices, GradFn, LocalOptimizer, LocalSpec, batch_schedule,
                                 train_client)


@dataclass
class ClientData:
    """One client's rows for a round: the gradient function every client has, and — on a
    client actor — the model and the tensors behind it (``None`` for the math tests'
    gradient-function clients, which have neither buffers nor features). ``indices`` turns a
    minibatch's index array into a tensor on the rows' device (default: a new one for
    ``inputs``; the client actor passes the one ``grad_fn`` uses): a minibatch of
    :meth:`LocalContext.batches` is then uploaded once, with its epoch."""

    n: int
    grad_fn: GradFn
    model: Any = None  # rayfl.models.FlatModel
    inputs: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    loss_fn: Callable | None = None
    indices: DeviceIndices | None = None

    def __post_init__(self):
        if self.indices is None and self.inputs is not None:
            self.indices = DeviceIndices(self.inputs.device)

    @property
    def has_buffers(self) -> bool:
        return self.model is not None and self.model.num_buffers > 0


class LocalContext:
    """One client's round for a client procedure (see the module docstring).

    ``steps`` counts the minibatches ``batches()`` handed out (the round's ``local_steps``);
    the reported training loss is the mean of the losses of gradient evaluations made with
    ``record=True`` (the default).
    """

    def __init__(self, task: ClientTask, data: ClientData, spec: LocalSpec,
                 rng: np.random.Generator, max_steps: int | None):
        self.task, self.data, self.spec = task, data, spec
        self.rng, self.max_steps = rng, max_steps
        self.steps = 0
        self._loss_sum, self._losses = 0.0, 0
        self._orders: list[tuple[np.ndarray, np.ndarray]] = []  # (each epoch's order, a copy)
        self._edited = False  # a minibatch was used while edited (even if put back later)

    # ----- what the round is -----------------------------------------------------------------
    @property
    def x(self) -> Vec:
        """Where local training starts (the broadcast's ``x``), read-only like all the
        broadcast: an in-place edit stops the run naming it (clone it to train on a copy)."""
        return self.task.bc["x"]

    @property
    def lr(self) -> float:
        """η_l of the round."""
        return self.task.lr

    @property
    def n(self) -> int:
        """The client's training samples."""
        return self.data.n

    def num_steps(self) -> int:
        """K_i: the minibatches one pass of :meth:`batches` yields (the step budget applied)."""
        k = self.spec.num_steps(self.n)
        return k if self.max_steps is None else min(k, self.max_steps)

    def batches(self) -> Iterator[np.ndarray]:
        """The round's minibatches (index arrays into the client's rows), in the flat-vector
        path's seeded order; a second call continues the same generator (fresh shuffles).
        They are lent read-only: on a GPU a minibatch's rows come from one upload of its
        epoch's order, which an edit in place would not reach (``np.sort(batch)`` makes a new
        array; an edit stops the run, :meth:`check_batches`)."""
        for idx in batch_schedule(self.n, self.spec, self.rng, self.max_steps):
            if not self._orders or idx.base is not self._orders[-1][0]:
                self._orders.append((idx.base, idx.base.copy()))
            self.steps += 1
            yield idx

    def check_batches(self, component: str, round: int | None = None,
                      client: int | None = None) -> None:
        """ComponentError naming ``component`` if a minibatch :meth:`batches` lent was edited
        in place (the same on every device: on a GPU the edit would not reach the rows)."""
        self._note_edits()
        if self._edited:
            raise ComponentError(component, "edited a minibatch of ctx.batches() in place; "
                                            "the index arrays rayfl lends are read-only (on "
                                            "a GPU the rows come from their upload): make a "
                                            "new array, e.g. np.sort(batch)", round, client)

    def _note_edits(self) -> None:
        """Note whether a minibatch :meth:`batches` lent is edited now: checked before each
        use too, so an edit put back before the procedure returns is seen."""
        self._edited = self._edited or any(not np.array_equal(order, copy)
                                           for order, copy in self._orders)

    def optimizer(self, lr: float | None = None) -> LocalOptimizer:
        """A fresh local optimiser of the configured kind (``local.*``), at ``lr`` (default η_l)."""
        return LocalOptimizer(self.spec, self.lr if lr is None else lr, self.x)

    def group(self, name: str) -> torch.Tensor:
        """Boolean mask of a parameter group over the flat vector (``head``, ``body``, ``norm``,
        ``embedding`` or a glob over parameter names; :class:`rayfl.models.flat.Layout`)."""
        return self._model().layout.mask(name).to(self.x.device)

    def train(self, rule: LocalRule = PLAIN_SGD, start: Vec | None = None) -> Vec:
        """The round's local training on flat vectors from ``start`` (default: ``x``) under
        ``rule``: every minibatch of :meth:`batches`, the configured optimiser on
        ``rule.direction`` of the gradient at ``rule.grad_point``; returns the final iterate."""
        y, steps, loss_sum = train_client(rule, self.x if start is None else start,
                                          self.data.grad_fn, self.n, self.spec, self.lr,
                                          self.rng, self.max_steps)
        self.steps += steps
        self._loss_sum += loss_sum
        self._losses += steps
        return y

    # ----- the model as a function of a flat vector ------------------------------------------
    def loss_grad(self, point: Vec, batch: np.ndarray, record: bool = True):
        """(loss, flat gradient) of the run's loss at ``point`` on ``batch``. The gradient is a
        buffer the next evaluation overwrites: clone it to keep it."""
        self._note_edits()
        loss, g = self.data.grad_fn(point, batch)
        if record:
            self._record(loss)
        return loss, g

    def probe_grad(self, point: Vec, batch: np.ndarray, record: bool = False) -> Vec:
        """A copy of the flat gradient at ``point`` on ``batch`` that leaves BatchNorm
        statistics as they were: a look-ahead or perturbed point's gradient (SAM's ascent,
        MAML's adaptation), so that each local step updates the statistics once."""
        saved = self.get_buffers()
        g = self.loss_grad(point, batch, record=record)[1].clone()
        self.set_buffers(saved)
        return g

    def outputs(self, point: Vec, batch: np.ndarray, features: tuple[str, ...] = ()):
        """(logits, {name: intermediate output}, labels) of ``point`` on ``batch``,
        differentiable for :meth:`backward` (``"repr"``: the classifier head's input; other
        names are module names). A training forward: BatchNorm statistics update."""
        model = self._model()
        self._note_edits()
        idx = self.data.indices(batch)
        logits, feats = model.outputs(point, self.data.inputs[idx], tuple(features))
        return logits, feats, self.data.labels[idx]

    @torch.no_grad()
    def features(self, point: Vec, batch: np.ndarray, features: tuple[str, ...] = ()):
        """:meth:`outputs` of another model (the global one, the previous local one), without
        gradients, leaving the trained model's parameters and buffers as they were: a
        :meth:`backward` of a loss built before this call still differentiates at its point."""
        model = self._model()
        loaded = model.w.clone()
        try:
            with model.scratch_buffers():
                return self.outputs(point, batch, features)
        finally:
            model.load(loaded)

    def get_buffers(self) -> torch.Tensor:
        """The trained model's buffers now (BatchNorm statistics; empty when it has none): the
        runtime uploads what they are when ``client_train`` returns."""
        return self.data.model.get_buffers() if self.data.has_buffers else torch.zeros(0)

    def set_buffers(self, buffers: torch.Tensor) -> None:
        """Replace the trained model's buffers (e.g. a personal model's statistics)."""
        if self.data.has_buffers:
            self.data.model.set_buffers(buffers)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The run's loss (the one :meth:`loss_grad` differentiates)."""
        return self.data.loss_fn(logits, labels)

    def backward(self, loss: torch.Tensor, record: bool = True) -> Vec:
        """Flat gradient of ``loss`` (built from the last :meth:`outputs`) in the parameters of
        the point that call loaded; overwritten by the next evaluation."""
        if record:
            self._record(loss)
        return self._model().backward(loss)

    # ----- bookkeeping -----------------------------------------------------------------------
    def mean_loss(self) -> float:
        """The mean loss of the gradient evaluations recorded so far (NaN: none)."""
        return float(self._loss_sum) / self._losses if self._losses else float("nan")

    def _record(self, loss: torch.Tensor) -> None:
        value = loss.detach()
        if value.device.type == "cpu":
            self._loss_sum += float(value)
        else:  # summed on the device, in the same order (reading it each step waits for it)
            self._loss_sum = value.double() + self._loss_sum
        self._losses += 1

    def _model(self):
        if self.data.model is None:
            raise TypeError("this client is a gradient function (no model): a client procedure "
                            "that reads outputs, features or groups needs a model-backed client")
        return self.data.model
