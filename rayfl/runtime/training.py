"""Training the clients of a round's groups, wherever an executor runs them.

:func:`train_groups` is what every executor does with the groups it is handed: for each client
in order, load its state, run the algorithm's ``client_train``, pass the upload through the
layers' client halves, save the new state and add the result to the group's
:class:`PartialSum`. A Ray client actor, the in-process executor and the gradient-function
executor of the math tests (:func:`rayfl.runtime.harness.simulate`) all call it, so there is one
client code path — and one place where what the algorithm hands back is checked, and where
what the user's code is lent is held read-only (:class:`~rayfl.contract.Lent`): the broadcast
(``task.bc``, ``ctx.x``), the client's stored state (``task.state``), a layer's broadcast and
state (``ctx.broadcast``, ``ctx.state``); and where the model's buffers keep the tensors, shapes
and dtypes they were built with (what is averaged and saved).
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence

import torch

from rayfl import rng
from rayfl.algorithms.base import (Algorithm, ClientResult, ClientTask, Upload, Vec,
                                   check_client_state)
from rayfl.contract import (ComponentError, Lent, Trail, calling, describe, name_of,
                            returned_vector)
from rayfl.layers import Broadcast, ClientContext, ClientState, Stack, tensors
from rayfl.runtime.aggregate import PartialSum
from rayfl.runtime.client_state import decode, encode
from rayfl.runtime.context import ClientData, LocalContext
from rayfl.runtime.local import LocalSpec

#: one client's work order: (client id, aggregation weight, state version, step budget or None)
Work = tuple[int, float, int, "int | None"]


class Store(Protocol):
    """Versioned client state (:class:`rayfl.runtime.state_store.StateStore` or in memory)."""

    def load(self, client: int, version: int) -> dict[str, Vec] | None: ...

    def save(self, client: int, version: int, state: dict[str, Vec]) -> None: ...


class MemoryStore:
    """Client state in a dict (the math tests; no budget, nothing spilled)."""

    def __init__(self):
        self.states: dict[tuple[int, int], dict[str, Vec]] = {}

    def load(self, client: int, version: int) -> dict[str, Vec] | None:
        return self.states.get((client, version)) if version >= 0 else None

    def save(self, client: int, version: int, state: dict[str, Vec]) -> None:
        self.states[(client, version)] = state


#: client id -> the client's rows for the round
Source = Callable[[int], ClientData]


def run_client(algorithm: Algorithm, task: ClientTask, ctx: LocalContext,
               where: str | None = None) -> ClientResult:
    """The algorithm's ``client_train`` for one client, its result checked: one
    :class:`~rayfl.contract.ComponentError` naming the method (``where``: its name, when the
    caller has it already), the round and the client when it raises or hands back something
    else than its contract says."""
    where = where or name_of(type(algorithm), "client_train")
    x = task.bc["x"]
    lent = Lent().add('task.bc["x"] (ctx.x)', x).add(
        "task.bc", {k: v for k, v in task.bc.items() if k != "x"}).add("task.state", task.state)
    with calling(where, task.t, task.client_id):
        result = algorithm.client_train(task, ctx)
    lent.check(where, task.t, task.client_id)
    ctx.check_batches(where, task.t, task.client_id)

    def fail(problem: str):
        raise ComponentError(where, problem, task.t, task.client_id)

    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], ClientResult):
        fail("returned (y, ClientResult(payload, state)), the interface before rayfl 0.2: "
             "return ClientResult(y, payload, state) — the final local model first")
    if not isinstance(result, ClientResult):
        fail(f"returned {describe(result)}, not a ClientResult(model, payload, state, upload)")
    for what, vec in (("model", result.model), ("upload", result.upload)):
        if vec is None and what == "upload":
            continue
        if not isinstance(vec, torch.Tensor) or vec.shape != x.shape or \
                not vec.is_floating_point():
            fail(f"returned a {what} that is {describe(vec)}, not a floating-point vector "
                 f"shaped like x {tuple(x.shape)}")
    if not isinstance(result.payload, dict):
        fail(f"returned a payload that is {describe(result.payload)}, not a dict")
    for key, value in result.payload.items():
        inner = getattr(value, "value", value)  # Rows, Upload
        if not isinstance(inner, (torch.Tensor, int, float)) or isinstance(inner, bool):
            fail(f"returned payload entry {key!r} that is {describe(inner)}: payload values are "
                 "tensors or numbers, summed over the round's clients")
        if isinstance(value, Upload) and not (isinstance(inner, torch.Tensor)
                                              and inner.dtype == x.dtype):
            fail(f"returned Upload payload entry {key!r} that is {describe(inner)}, not a "
                 f"tensor of the model's dtype {_of(x.dtype)} (it is sent joined to the upload)")
    if result.payload and any(isinstance(v, Upload) for v in result.payload.values()):
        result.payload = {k: Upload(v.value.detach(), v.rows) if isinstance(v, Upload) else v
                          for k, v in result.payload.items()}  # sent, not trained
    if result.state is not None:
        problem = check_client_state(algorithm, result.state, x.numel())
        if problem:
            fail(problem)
    return result


def settle(algorithm: Algorithm, state: dict, messages, t: int, client: int) -> dict:
    """The algorithm's ``client_settle`` of a stored state (which it reads, never edits)."""
    where = name_of(type(algorithm), "client_settle")
    lent = Lent().add("state", state)
    with calling(where, t, client):
        settled = algorithm.client_settle(state, messages)
    lent.check(where, t, client)
    return settled


#: a model's persistent buffers: (name, shape, dtype)
Buffers = list[tuple[str, torch.Size, torch.dtype]]


def _named_buffers(model) -> list[tuple[str, torch.Tensor]]:
    """The model's persistent buffers by name, in ``persistent_buffers``' order."""
    return [(f"{prefix}{'.' if prefix else ''}{name}", b)
            for prefix, mod in model.module.named_modules()
            for name, b in mod.named_buffers(recurse=False)
            if b is not None and name not in mod._non_persistent_buffers_set]


def buffer_layout(model) -> Buffers:
    """The names, shapes and dtypes of the model's persistent buffers now."""
    return [(name, b.shape, b.dtype) for name, b in _named_buffers(model)]


def check_buffers(model, before: Buffers, t: int, client: int) -> None:
    """ComponentError naming the model's forward when a buffer changed shape or dtype during
    a client's training (``before``: the layout when it started), or was replaced by another
    tensor: rayfl averages, saves and sets the buffers the model registered, in their shape."""
    where = name_of(type(model.module), "forward")
    now = _named_buffers(model)

    def fail(problem: str):
        raise ComponentError(where, f"{problem} during training; a buffer keeps the shape and "
                                    "dtype it was built with and is updated in place (rayfl "
                                    "averages and saves the buffers the model registered)",
                             t, client)

    if [name for name, _ in now] != [name for name, *_ in before]:
        fail(f"its buffers went from {[n for n, *_ in before]} to {[n for n, _ in now]}")
    for (name, b), (_, shape, dtype), kept in zip(now, before, model.buffers):
        if b.shape != shape or b.dtype != dtype:
            fail(f"buffer {name!r} went from {_of(dtype)} {tuple(shape)} to {_of(b.dtype)} "
                 f"{tuple(b.shape)}")
        if b is not kept:
            fail(f"buffer {name!r} was replaced by another tensor (assigned, not updated in "
                 "place)")


def _of(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def joined(delta: Vec, payload: dict) -> Vec:
    """The upload the layers' client halves see: Δ_i followed by every :class:`Upload`
    payload entry, flattened, sorted by key (Δ_i alone when there is none)."""
    if not payload:
        return delta
    sent = [payload[k].value.reshape(-1).to(delta.device) for k in sorted(payload)
            if isinstance(payload[k], Upload)]
    return torch.cat([delta, *sent]) if sent else delta


def split(joint: Vec, dim: int, payload: dict) -> tuple[Vec, dict]:
    """Δ_i and the payload back from the upload as the last client half left it: each
    :class:`Upload` entry replaced by its part, in its shape."""
    if joint.numel() == dim:
        return joint, payload
    out, start = dict(payload), dim
    for key in sorted(payload):
        v = payload[key]
        if isinstance(v, Upload):
            part = joint[start:start + v.value.numel()]  # a copy: a view would ship it all
            out[key] = Upload(part.reshape(v.value.shape).clone(), v.rows)
            start += v.value.numel()
    return joint[:dim], out


def train_groups(stack: Stack, groups: Iterable[tuple[int, Sequence[Work]]], bc: Broadcast,
                 lr: float, t: int, seed: int, source: Source, store: Store, spec: LocalSpec,
                 on_model: Callable[[int, Vec], None] | None = None, messages=None,
                 device: torch.device | None = None):
    """Train every client of every group; returns ([(group, PartialSum)], clients written).

    A client's state is settled first (the algorithm's ``client_settle`` with the ``messages``
    of the round that wrote it), when the algorithm declares that capability.
    ``on_model(client, y)`` sees each client's final local model (analysis keeps them).
    With a ``device``, torch's generators are seeded for each client before anything of it
    runs (:func:`rayfl.rng.seed_torch`), so what its code draws from them does not depend on
    where or after whom it trains.
    """
    algorithm, layers = stack.algorithm, stack.layers
    traits = algorithm.traits
    trains = name_of(type(algorithm), "client_train")
    applies = [stack.client_half(i) for i in range(len(layers))]
    sums, written = [], []
    x = bc.algorithm["x"]
    for group, tasks in groups:
        acc = PartialSum()
        for client, weight, version, budget in tasks:
            if device is not None:  # torch's own draws (dropout, a user's randn): keyed too
                rng.seed_torch(seed, t, client, device)
            data = source(client)
            saved = decode(store.load(client, version), stack)
            state = saved.algorithm
            if state is not None and traits.has("settle"):
                state = settle(algorithm, state, messages.load(version), t, client)
            if data.has_buffers:
                own = traits.local_buffers and saved.buffers is not None
                data.model.set_buffers(saved.buffers if own else bc.buffers)
                built = buffer_layout(data.model)
            steps = spec.num_steps(data.n)
            task = ClientTask(client, t, lr, weight, dict(bc.algorithm), state,
                              steps if budget is None else min(steps, budget))
            ctx = LocalContext(task, data, spec, rng.client_stream(seed, t, client), budget)
            result = run_client(algorithm, task, ctx, trains)
            if data.has_buffers:
                check_buffers(data.model, built, t, client)
            if on_model is not None:
                on_model(client, result.model)
            delta = x - result.model if result.upload is None else result.upload
            payload = result.payload
            loss = ctx.mean_loss()
            kept, payloads = [], []
            if layers:
                upload = joined(delta, payload)
                like, shaped = (x, "like the model's x") if upload is delta else (
                    upload.new_empty(upload.shape, dtype=x.dtype),
                    f"the model's {x.numel()} numbers then its Upload entries' "
                    f"{upload.numel() - x.numel()}")
                delta, uploads = upload, Trail("an upload", upload)
            for i, layer in enumerate(layers):
                lc = ClientContext(t, client, loss, weight, data.n, dict(bc.layers[i]),
                                   dict(saved.layers[i] or {}), dim=x.numel())
                name = applies[i]
                lent = Lent().add("ctx.broadcast", bc.layers[i]).add("ctx.state", saved.layers[i])
                with calling(name, round=t, client=client):
                    delta = returned_vector(layer.client_apply(delta, t, client, lc), like,
                                            name, "the upload it returned", t, shaped)
                lent.check(name, t, client)
                kept.append(tensors(lc.state, name, "ctx.state", t) or None)
                payloads.append(lc.payload)
                uploads.add(name, delta)
            if layers:
                uploads.check(t, client)
                delta, payload = split(delta, x.numel(), payload)
            buffers = data.model.get_buffers() if data.has_buffers else None
            new = ClientState(result.state, tuple(kept),
                              buffers if traits.local_buffers else None)
            if not new.empty():
                store.save(client, t, encode(new))
                written.append(client)
            acc.add_client(client, delta, weight, ctx.steps, data.n, loss, payload,
                           payloads, buffers, stack.needs_updates,
                           trains, t)
        sums.append((group, acc))
    return sums, written
