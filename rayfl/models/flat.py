"""A torch module whose parameters and gradients are views into two flat buffers.

Every server rule and client-state update then works on one contiguous vector, and loading a
model is a single ``copy_``. A model's registered buffers (BatchNorm running statistics and
counters) are the model too: :meth:`FlatModel.get_buffers` / :meth:`FlatModel.set_buffers` move
them as one float32 vector, beside the parameters, so they travel, average and checkpoint.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
from typing import Iterator

import numpy as np
import torch
from torch import nn

from rayfl.contract import Lent, name_of
from rayfl.models.metrics import accuracy


class FlatModel:
    """Wraps ``module`` so that ``self.w`` holds all parameters and ``self.g`` all gradients.

    With ``channels_last``, 4-d (convolution) weights keep their own channels-last copy, which
    makes the convolutions run in NHWC layout (oneDNN's fast path on CPU, and cuDNN's on GPU);
    ``w`` and ``g`` keep the usual parameter order, and each load and gradient copies those
    few weights across (the other parameters stay views).
    """

    def __init__(self, module: nn.Module, device: str | torch.device = "cpu",
                 channels_last: bool = False):
        self.module = module.to(device)
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.w = torch.cat([p.detach().reshape(-1) for p in params]).contiguous()
        self.g = torch.zeros_like(self.w)
        self.copied: list[tuple[nn.Parameter, torch.Tensor, torch.Tensor]] = []
        offset = 0
        for p in params:
            n = p.numel()
            w, g = self.w[offset:offset + n].view_as(p), self.g[offset:offset + n].view_as(p)
            if channels_last and p.dim() == 4:
                p.data = w.clone(memory_format=torch.channels_last)
                p.grad = torch.zeros_like(p.data)
                self.copied.append((p, w, g))
            else:
                p.data, p.grad = w, g
            offset += n
        self.dim = offset
        self.device = self.w.device
        self.layout = Layout.of(self.module)
        self.buffers = persistent_buffers(self.module)
        self.num_buffers = sum(b.numel() for b in self.buffers)

    def get_buffers(self) -> torch.Tensor:
        """Every registered buffer as one float32 vector (integer counters as floats)."""
        if not self.buffers:
            return torch.zeros(0, device=self.device)
        return torch.cat([b.detach().reshape(-1).float() for b in self.buffers])

    def set_buffers(self, flat: torch.Tensor | None) -> None:
        """Set every buffer from a vector of :meth:`get_buffers`'s layout (integer buffers take
        the nearest integer: an averaged ``num_batches_tracked`` stays a count)."""
        if flat is None or not self.buffers:
            return
        offset = 0
        for b in self.buffers:
            n = b.numel()
            part = flat[offset:offset + n].view_as(b)
            b.copy_(part if b.is_floating_point() else torch.round(part))
            offset += n

    @contextlib.contextmanager
    def scratch_buffers(self) -> Iterator[None]:
        """Run forwards on copies of the buffers, leaving the buffers themselves untouched: a
        forward of another model in the middle of a step updates no BatchNorm statistic (and no
        tensor a pending backward saved)."""
        owners = [(m, name, b) for m in self.module.modules()
                  for name, b in m.named_buffers(recurse=False)]
        try:
            for m, name, b in owners:
                m._buffers[name] = b.clone()
            yield
        finally:
            for m, name, b in owners:
                m._buffers[name] = b

    def load(self, flat: torch.Tensor) -> None:
        """Set all parameters from a flat vector."""
        self.w.copy_(flat)
        for p, w, _ in self.copied:
            p.data.copy_(w)

    def loss_and_grad(self, point: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                      loss_fn) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss and flat gradient at ``point`` on one minibatch (gradient buffer is reused)."""
        self.load(point)
        loss = loss_fn(self.module(x), y)
        return loss.detach(), self.backward(loss)

    def outputs(self, point: torch.Tensor, x: torch.Tensor,
                features: tuple[str, ...] = ()) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Logits of ``point`` on ``x`` and the named intermediate outputs (differentiable in
        the module's parameters; ``repr`` is the input of the classifier head). Gradients reach
        :attr:`g` through :meth:`backward`."""
        self.load(point)
        captured: dict[str, torch.Tensor] = {}
        hooks = []
        for name in features:
            if name == REPR:
                head = self.module.get_submodule(self.layout.head)
                hooks.append(head.register_forward_pre_hook(
                    lambda _m, args: captured.__setitem__(REPR, args[0])))
            else:
                hooks.append(self.module.get_submodule(name).register_forward_hook(
                    lambda _m, _a, out, name=name: captured.__setitem__(name, out)))
        try:
            logits = self.module(x)
        finally:
            for h in hooks:
                h.remove()
        return logits, captured

    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        """∇ loss into the flat gradient :attr:`g` (overwritten by the next call)."""
        self.g.zero_()
        for p, _, _ in self.copied:
            p.grad.zero_()
        loss.backward()
        for p, _, g in self.copied:
            g.copy_(p.grad)
        return self.g

    @torch.no_grad()
    def predict(self, point: torch.Tensor, x: torch.Tensor, batch_size: int = 1000):
        """Outputs of ``point`` on ``x``, in batches (eval mode); ``x`` (the server's test set,
        a client's held-out rows) is lent: a forward that edits its input in place is named."""
        self.load(point)
        self.module.eval()
        lent = Lent().add("its input", x)
        out = torch.cat([self.module(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])
        lent.check(name_of(self.module, "forward"))
        self.module.train()
        return out

    @torch.no_grad()
    def evaluate(self, point: torch.Tensor, x: torch.Tensor, y: torch.Tensor, loss_fn,
                 batch_size: int = 1000) -> tuple[float, float]:
        """(mean loss, accuracy) of ``point`` on a labelled set."""
        if len(y) == 0:
            return float("nan"), float("nan")
        out = self.predict(point, x, batch_size)
        return float(loss_fn(out, y)), accuracy(out, y, loss_fn)


def flat_spec(module: nn.Module) -> tuple[int, torch.dtype]:
    """(length, dtype) of the vector :class:`FlatModel` makes of ``module``'s trainable
    parameters (their types promoted as its concatenation promotes them)."""
    params = [p.detach().reshape(-1) for p in module.parameters() if p.requires_grad]
    return sum(p.numel() for p in params), torch.cat([p[:0] for p in params]).dtype


def sha256_of(flat: np.ndarray) -> str:
    """sha256 of a flat float32 parameter vector's bytes (the run's ``model_sha256``)."""
    return hashlib.sha256(np.ascontiguousarray(flat, dtype=np.float32).tobytes()).hexdigest()


def persistent_buffers(module: nn.Module) -> list[torch.Tensor]:
    """The module's state buffers (those in its ``state_dict``: BatchNorm statistics and
    counters), in ``named_buffers`` order; non-persistent ones (constant masks, tables) are
    rebuilt with the model and never travel."""
    out = []
    for mod in module.modules():
        out += [b for name, b in mod.named_buffers(recurse=False)
                if b is not None and name not in mod._non_persistent_buffers_set]
    return out


REPR = "repr"  # the feature name of the classifier head's input
NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)


class Layout:
    """Where each named parameter lives in the flat vector, and named parts of the model.

    A part (a *parameter group*) is named by a module type — ``head`` (the last ``nn.Linear``,
    the classifier), ``body`` (everything else), ``norm`` (normalisation layers), ``embedding``
    — or by a glob over parameter names (``fc2.*``, ``*.bias``).
    """

    def __init__(self, names: list[str], sizes: list[int], kinds: dict[str, str], head: str):
        self.names, self.sizes, self.head = names, sizes, head
        self.kinds = kinds  # parameter name -> "norm" | "embedding" | "other"
        self.offsets = [0]
        for n in sizes:
            self.offsets.append(self.offsets[-1] + n)

    @classmethod
    def of(cls, module: nn.Module) -> "Layout":
        names, sizes, kinds, head = [], [], {}, ""
        for mod_name, mod in module.named_modules():
            if isinstance(mod, nn.Linear):
                head = mod_name
            kind = "norm" if isinstance(mod, NORM_TYPES) else \
                "embedding" if isinstance(mod, nn.Embedding) else "other"
            for p_name, p in mod.named_parameters(recurse=False):
                if p.requires_grad:
                    full = f"{mod_name}.{p_name}" if mod_name else p_name
                    names.append(full)
                    sizes.append(p.numel())
                    kinds[full] = kind
        order = [n for n, p in module.named_parameters() if p.requires_grad]
        index = {n: i for i, n in enumerate(names)}
        return cls(order, [sizes[index[n]] for n in order], kinds, head)

    def params_in(self, group: str) -> list[str]:
        """The parameter names of ``group`` (ValueError naming the groups when it is empty)."""
        if group == "head":
            chosen = [n for n in self.names if n.rsplit(".", 1)[0] == self.head]
        elif group == "body":
            chosen = [n for n in self.names if n.rsplit(".", 1)[0] != self.head]
        elif group in ("norm", "embedding"):
            chosen = [n for n in self.names if self.kinds[n] == group]
        else:
            chosen = [n for n in self.names if fnmatch.fnmatchcase(n, group)]
        if not chosen:
            raise ValueError(f"parameter group {group!r} matches no parameter of the model "
                             f"(groups: head, body, norm, embedding, or a glob over "
                             f"{', '.join(self.names)})")
        return chosen

    def mask(self, group: str) -> torch.Tensor:
        """A boolean vector over the flat parameters: True where ``group``'s parameters are."""
        mask = torch.zeros(self.offsets[-1], dtype=torch.bool)
        chosen = set(self.params_in(group))
        for i, name in enumerate(self.names):
            if name in chosen:
                mask[self.offsets[i]:self.offsets[i + 1]] = True
        return mask
