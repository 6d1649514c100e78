"""Partial sums of client results: what a group of clients sends back, and how groups combine.

A :class:`PartialSum` accumulates clients in a fixed order and is combined with other groups in
group order, so the floating-point result never depends on which actor ran which group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from rayfl.algorithms.base import Aggregate, Collected, Rows, Upload
from rayfl.contract import ComponentError


def _add(a: Any, b: Any, key: str, where: str, t: int, client: int) -> Any:
    """``a + b`` of a summed payload entry (ComponentError naming it when the two cannot be
    added: a payload that changes shape between clients)."""
    if a is None:
        return b.clone() if isinstance(b, torch.Tensor) else b
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape:
        raise ComponentError(where, f"returned payload entry {key!r} of shape {tuple(b.shape)}, "
                                    f"where an earlier client's was {tuple(a.shape)}: a payload "
                                    "keeps its shape over the round", t, client)
    return a + b


def _same_shape(rows: list, row: Any, key: str, where: str, t: int, client: int) -> None:
    """A :class:`Rows` entry keeps one shape over the round (the server stacks the rows):
    ComponentError naming it otherwise."""
    shape, first = (tuple(getattr(r, "shape", ())) for r in (row, rows[0] if rows else row))
    if shape != first:
        raise ComponentError(where, f"returned Rows payload entry {key!r} of shape {shape}, "
                                    f"where an earlier client's was {first}: "
                                    "every client's row has the same shape (the server stacks "
                                    "them)", t, client)


#: a payload entry's kind: (sent as an Upload, collected row by row) -> what it is called
KINDS = {(False, False): "summed", (False, True): "Rows", (True, False): "Upload",
         (True, True): "Upload(rows=True)"}


def _kind(value: Any) -> tuple[bool, bool]:
    """(sent as an Upload, collected row by row) of one client's payload value."""
    upload = isinstance(value, Upload)
    return upload, isinstance(value, Rows) or upload and value.rows


def _sum(a: Any, b: Any) -> Any:
    return b.clone() if a is None and isinstance(b, torch.Tensor) else (b if a is None else a + b)


#: tensor dtypes numpy holds bit for bit
NUMPY_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.complex64,
                          torch.complex128, torch.int64, torch.int32, torch.int16, torch.int8,
                          torch.uint8, torch.bool})


def as_array(v: Any) -> Any:
    """A plain CPU tensor as the numpy array over its memory, where numpy has its dtype;
    anything else as it is. Ray sends an array's memory as it is, where it pickles a tensor
    through a copy."""
    if isinstance(v, torch.Tensor) and v.device.type == "cpu" and v.layout == torch.strided \
            and v.dtype in NUMPY_DTYPES and not (v.requires_grad or v.is_conj() or v.is_neg()):
        return v.numpy()
    return v


def as_tensor(v: Any) -> Any:
    """:func:`as_array`'s array back as a tensor over memory of its own (writable: Ray hands
    back a read-only view of its object store)."""
    return torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v


@dataclass
class PartialSum:
    """Running sums over completed clients (see :class:`rayfl.algorithms.base.Aggregate`)."""

    count: int = 0
    weight_sum: float = 0.0
    delta_w: torch.Tensor | None = None  # Σ w_i Δ_i
    delta: torch.Tensor | None = None  # Σ Δ_i
    delta_sq: float = 0.0  # Σ ‖Δ_i‖²
    steps: int = 0
    samples: int = 0
    loss_sum: float = 0.0  # Σ mean local loss of each client
    client_losses: list[tuple[int, float]] = field(default_factory=list)  # (client, mean loss)
    extras: dict[str, Any] = field(default_factory=dict)  # the algorithm's payload sums
    rows: dict[str, tuple[list[int], list[torch.Tensor]]] = field(default_factory=dict)
    uploaded: tuple[str, ...] = ()  # payload keys sent as Upload entries, first seen first
    #: str(numbers uploaded) -> clients, of the clients that sent Upload entries
    upload_sizes: dict[str, int] = field(default_factory=dict)
    layers: list[dict[str, Any]] = field(default_factory=list)  # each layer's payload sums
    buffers_w: torch.Tensor | None = None  # Σ w_i b_i of the clients' model buffers
    updates: list[torch.Tensor] = field(default_factory=list)  # only with keep_updates
    source: tuple[str, int] = ("client_train", 0)  # who made the payload, and the round

    def add_client(self, client_id: int, delta: torch.Tensor, weight: float, steps: int,
                   samples: int, loss: float, payload: dict, layer_payloads: list[dict],
                   buffers: torch.Tensor | None = None, keep_update: bool = False,
                   where: str = "client_train", t: int = 0) -> None:
        """Accumulate one client's upload Δ_i, its weight, the algorithm's payload (``where``
        names it in an error), each layer's payload and its model's buffers after training
        (BatchNorm statistics; None: the model has none); with ``keep_update``, Δ_i itself."""
        self.source = (where, t)
        self.count += 1
        self.weight_sum += weight
        # the running sums are this PartialSum's own tensors: added to in place
        scaled = delta * weight
        if self.delta_w is None:
            self.delta_w, self.delta = scaled, delta.clone()
        else:
            self.delta_w += scaled
            self.delta += delta
        wide = delta.double()
        self.delta_sq += float(torch.dot(wide, wide))
        self.steps += steps
        self.samples += samples
        self.loss_sum += loss
        self.client_losses.append((int(client_id), float(loss)))
        if payload:
            self._payload(client_id, delta.numel(), payload, where, t)
        if not self.layers:
            self.layers = [{} for _ in layer_payloads]
        for own, sums in zip(layer_payloads, self.layers):
            for k, v in own.items():
                sums[k] = _sum(sums.get(k), v)
        if buffers is not None:
            self.buffers_w = _sum(self.buffers_w, buffers * weight)
        if keep_update:
            self.updates.append(delta.clone())

    def _payload(self, client_id: int, dim: int, payload: dict, where: str, t: int) -> None:
        """Add one client's payload: each entry summed or collected as its kind says, and the
        numbers it uploaded when it sent Upload entries."""
        entries = [v.value.numel() for v in payload.values() if isinstance(v, Upload)]
        if entries:
            size = str(dim + sum(entries))
            self.upload_sizes[size] = self.upload_sizes.get(size, 0) + 1
        for k, v in payload.items():
            upload, by_rows = kind = _kind(v)
            self._one_kind(k, kind, where, t, client_id)
            if upload and k not in self.uploaded:
                self.uploaded += (k,)
            if by_rows:
                ids, rows = self.rows.setdefault(k, ([], []))
                _same_shape(rows, v.value, k, where, t, client_id)
                ids.append(int(client_id))
                rows.append(v.value)
            else:
                self.extras[k] = _add(self.extras.get(k), getattr(v, "value", v), k, where, t,
                                      client_id)

    def merge(self, other: "PartialSum") -> "PartialSum":
        """This sum followed by ``other`` (order matters for bitwise reproducibility)."""
        if other.count == 0:
            return self
        self.count += other.count
        self.weight_sum += other.weight_sum
        self.delta_w = _sum(self.delta_w, other.delta_w)
        self.delta = _sum(self.delta, other.delta)
        self.delta_sq += other.delta_sq
        self.steps += other.steps
        self.samples += other.samples
        self.loss_sum += other.loss_sum
        self.client_losses += other.client_losses
        where, t = other.source
        for k in (*other.extras, *other.rows):
            self._one_kind(k, (k in other.uploaded, k in other.rows), where, t, None)
        self.uploaded += tuple(k for k in other.uploaded if k not in self.uploaded)
        for size, clients in other.upload_sizes.items():
            self.upload_sizes[size] = self.upload_sizes.get(size, 0) + clients
        for k, v in other.extras.items():
            self.extras[k] = _add(self.extras.get(k), v, k, where, t, None)
        for k, (ids, rows) in other.rows.items():
            mine = self.rows.setdefault(k, ([], []))
            if rows:
                _same_shape(mine[1], rows[0], k, where, t, ids[0])
            mine[0].extend(ids)
            mine[1].extend(rows)
        if not self.layers:
            self.layers = [{} for _ in other.layers]
        for mine, theirs in zip(self.layers, other.layers):
            for k, v in theirs.items():
                mine[k] = _sum(mine.get(k), v)
        self.updates += other.updates
        if other.buffers_w is not None:
            self.buffers_w = _sum(self.buffers_w, other.buffers_w)
        return self

    def _one_kind(self, key: str, kind: tuple[bool, bool], where: str, t: int,
                  client: int | None) -> None:
        """ComponentError naming ``where`` when ``key`` comes as another kind than an earlier
        client's: an entry is summed, Rows, Upload or Upload(rows=True) over the whole round."""
        if key not in self.extras and key not in self.rows:
            return
        before = (key in self.uploaded, key in self.rows)
        if kind != before:
            raise ComponentError(where, f"returned payload entry {key!r} as {KINDS[kind]}, where "
                                        f"an earlier client's was {KINDS[before]}: an entry is "
                                        "of one kind over the round", t, client)

    def map_values(self, fn: Callable[[Any], Any]) -> "PartialSum":
        """Every sum and collected row replaced by ``fn`` of it, in place (``fn`` also sees
        the payload sums that are numbers and None, and hands them back as they are)."""
        self.delta_w, self.delta = fn(self.delta_w), fn(self.delta)
        self.buffers_w = fn(self.buffers_w)
        self.extras = {k: fn(v) for k, v in self.extras.items()}
        self.rows = {k: (ids, [fn(r) for r in rows]) for k, (ids, rows) in self.rows.items()}
        self.layers = [{k: fn(v) for k, v in own.items()} for own in self.layers]
        self.updates = [fn(v) for v in self.updates]
        return self

    def compact(self) -> "PartialSum":
        """This sum as an answer carries it, in place: a one-client sum leaves out Σ w_i Δ_i,
        which is w Δ to the bit (:meth:`add_client` computes it so, and 0 + w is w for a w
        other than ±0) and :meth:`expand` computes again on arrival; the answer is half as
        large."""
        if self.count == 1 and self.weight_sum != 0.0:
            self.delta_w = None
        return self

    def expand(self) -> "PartialSum":
        """:meth:`compact` undone, in place: a one-client sum's Σ w_i Δ_i computed as w Δ."""
        if self.count == 1 and self.delta_w is None:
            self.delta_w = self.delta * self.weight_sum
        return self

    def to(self, device: str | torch.device) -> "PartialSum":
        """Move every tensor (e.g. to the CPU before it leaves a GPU actor)."""
        return self.map_values(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v)

    def upload_bytes(self, per_client: Callable[[int], float], dim: int) -> float:
        """Bytes the clients uploaded: ``per_client(numbers)`` for each, numbers being ``dim``
        or, for a client that sent Upload entries, ``dim`` and theirs."""
        with_entries = sum(self.upload_sizes.values())
        return (self.count - with_entries) * per_client(dim) + sum(
            clients * per_client(int(size)) for size, clients in self.upload_sizes.items())

    def layer_sums(self, num_layers: int) -> tuple[dict, ...]:
        """Each layer's payload sums (empty dicts when no client completed)."""
        return tuple(self.layers) if self.layers else tuple({} for _ in range(num_layers))

    def finalize(self, num_sampled: int, num_clients: int, dim: int,
                 dtype=torch.float32) -> Aggregate:
        """The round's :class:`Aggregate` (zero update when no client completed)."""
        if self.count == 0 or self.weight_sum <= 0:
            zero = torch.zeros(dim, dtype=dtype)
            return Aggregate(0, num_sampled, num_clients, 0.0, zero, zero.clone(), 0.0, {})
        extras = dict(self.extras)
        extras.update({k: Collected(ids, torch.stack(rows))
                       for k, (ids, rows) in self.rows.items()})
        return Aggregate(
            count=self.count, num_sampled=num_sampled, num_clients=num_clients,
            weight_sum=self.weight_sum, delta_mean=self.delta_w / self.weight_sum,
            delta_sum=self.delta, delta_sq_sum=self.delta_sq, extras=extras,
            buffers_mean=None if self.buffers_w is None else self.buffers_w / self.weight_sum,
            updates=torch.stack(self.updates) if self.updates else None,
            uploaded=tuple(sorted(self.uploaded)))


def drift_metrics(agg: Aggregate, prev_delta_mean: torch.Tensor | None) -> dict[str, float]:
    """Common drift measures: ‖Δ̄‖, client drift mean_k ‖Δ_k − Δ̄‖², period drift ‖Δ̄_t − Δ̄_{t−1}‖²."""
    if agg.count == 0:
        return {}
    dm = agg.delta_mean.double()
    s = agg.count
    spread = (agg.delta_sq_sum / s - 2 * float(dm @ agg.delta_sum.double()) / s + float(dm @ dm))
    out = {"update_norm": float(dm.norm()), "client_drift": max(spread, 0.0)}
    if prev_delta_mean is not None:
        out["period_drift"] = float((dm - prev_delta_mean.double()).pow(2).sum())
    return out
