"""The client actor: hosts virtual clients, trains the sampled ones with one model in place.

One long-lived actor serves many virtual clients. Per round it receives groups of
``(client, weight, state version, step budget)``; for each client in order it loads the
client's rows (a zero-copy slice of the memory-mapped store) and persistent state, trains,
writes the new state, and adds the result to the group's :class:`PartialSum`. Only the groups'
sums leave the actor.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from rayfl.contract import Lent, calling, name_of
from rayfl.layers import Broadcast, Stack, tree_map
from rayfl.models import FlatModel, build_for
from rayfl.models.metrics import criterion
from rayfl.runtime.aggregate import as_array
from rayfl.runtime.client_eval import score_clients
from rayfl.runtime.client_state import decode
from rayfl.runtime.context import ClientData
from rayfl.runtime.local import DeviceIndices, LocalSpec
from rayfl.runtime.memory import peak_rss_mb, private_mb, reuse_freed_memory
from rayfl.runtime.messages import Messages
from rayfl.runtime.state_store import StateStore
from rayfl.runtime.training import train_groups


def in_ray_actor() -> bool:
    """Whether this process is a Ray actor (asking Ray nothing that would start one)."""
    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def pick_device(gpus: float) -> torch.device:
    """CUDA for a GPU share when torch sees one: in a Ray actor only if Ray assigned it a GPU,
    in the server's process (``runtime.executor: inprocess`` or ``threads``) the current
    device; else CPU."""
    if gpus <= 0 or not torch.cuda.is_available():
        return torch.device("cpu")
    if in_ray_actor() and not ray.get_gpu_ids():
        return torch.device("cpu")
    return torch.device("cuda")


def deterministic_kernels() -> None:
    """Only deterministic CUDA kernels from here on (``runtime.deterministic_gpu``): cuBLAS
    needs its fixed workspace, set before its first call."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def model_for(model_cfg, seed: int, handle, device) -> FlatModel:
    """The ``model`` section's network for the data behind ``handle``, initialised from the run
    seed, as a :class:`FlatModel`."""
    torch.manual_seed(seed)
    return FlatModel(build_for(model_cfg, handle), device, model_cfg.channels_last)


@dataclass(frozen=True)
class WorkerParts:
    """What a client actor is built from, each part from its own config section, built once on
    the driver and sent to every actor: the run's layers, the ``model`` section, the local
    optimiser, the seed, the actor's CPU and GPU share, and the run's stamp on client-state files
    (:func:`rayfl.runtime.checkpoint.state_stamp`); :func:`rayfl.assemble.worker_parts` builds
    them."""

    stack: Stack
    model: Any  # rayfl.models.config.ModelConfig
    spec: LocalSpec
    seed: int
    cpus: float
    gpus: float
    stamp: dict | None = None
    deterministic_gpu: bool = False


def inject_fault(t: int) -> None:
    """Fault-injection hook for tests: ``RAYFL_FAULT=kill:ROUND:MARKER`` (or ``stop:``) makes the
    first actor that starts round ROUND SIGKILL (SIGSTOP) itself, once (``full:`` makes it fail
    as on a full disk): it creates the file MARKER first, and no actor faults while MARKER
    exists."""
    spec = os.environ.get("RAYFL_FAULT")
    if not spec:
        return
    kind, at, marker = spec.split(":", 2)
    if int(at) != t:
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return
    if kind == "full":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), marker)
    os.kill(os.getpid(), signal.SIGKILL if kind == "kill" else signal.SIGSTOP)


def one_at_a_time(method):
    """``method`` holding its worker's turn: the worker does one call's work at a time."""
    @functools.wraps(method)
    def in_turn(self, *args, **kwargs):
        with self.turn:
            return method(self, *args, **kwargs)
    return in_turn


class ClientWorker:
    """The actor's body (a plain class, so tests and benchmarks can also run it in-process).
    Its calls do their work one at a time (a client actor runs two at once)."""

    def __init__(self, parts: WorkerParts, handle, state_root: str, budget_bytes: float):
        torch.set_num_threads(max(1, math.floor(parts.cpus)))
        self.seed = parts.seed
        self.device = pick_device(parts.gpus)
        if parts.deterministic_gpu and self.device.type == "cuda":
            deterministic_kernels()
        self.reader = handle.open()
        self.model = model_for(parts.model, parts.seed, handle, self.device)
        self.stack = parts.stack
        self.algorithm = self.stack.algorithm
        self.spec = parts.spec
        self.store = StateStore(state_root, budget_bytes, parts.stamp)
        self.messages = Messages(state_root)
        self.loss_fn = criterion(handle)
        self._round = None  # (round key, RoundData) of the last call
        self.turn = threading.Lock()

    @one_at_a_time
    def ready(self) -> dict:
        """Where this actor landed: node, GPUs Ray assigned, torch device and threads."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "device": str(self.device),
                "threads": torch.get_num_threads(),
                "deterministic": torch.are_deterministic_algorithms_enabled()}

    def _round_rows(self, t: int, round_clients: np.ndarray | None):
        """The round's :class:`~rayfl.data.regime.RoundData`, kept for the round's next call
        (an actor trains a round's groups in several calls; a drift regime's re-split is
        computed once)."""
        key = (t, None if round_clients is None else np.asarray(round_clients).tobytes())
        if self._round is None or self._round[0] != key:
            self._round = (key, self.reader.round(t, round_clients))
        return self._round[1]

    def _source(self, t: int, round_clients: np.ndarray | None):
        """client id -> its rows of round ``t`` (:class:`ClientData`: gradient function, model)."""
        rows = self._round_rows(t, round_clients)
        model, loss_fn, stack = self.model, self.loss_fn, self.stack
        classes = self.reader.handle.num_classes

        def source(client: int):
            raw_x, raw_y = rows.client(client)
            x, y = self.reader.tensors(raw_x, raw_y, self.device)
            for i, layer in enumerate(stack.layers):  # a label-flipping attacker
                with calling(stack.name(i, "client_labels"), t, client):
                    y = layer.client_labels(y, client, classes)

            indices = DeviceIndices(x.device)

            def grad_fn(point, idx):
                idx_t = indices(idx)
                return model.loss_and_grad(point, x[idx_t], y[idx_t], loss_fn)

            return ClientData(len(raw_y), grad_fn, model, x, y, loss_fn, indices)

        return source

    def train(self, t: int, bc: Broadcast, lr: float, groups,
              keep_dir: str | None = None, round_clients: np.ndarray | None = None) -> dict:
        """Train every client of every group; returns {"sums": [(group, PartialSum)], ...}.

        With ``keep_dir``, each client's final local model is also saved there for analysis.
        ``round_clients`` (every client dispatched this round) lets the FedEve drift regimes
        re-split the round's pooled data.
        """
        inject_fault(t)
        start = time.perf_counter()
        bc_t = tree_map(lambda v: torch.as_tensor(np.array(v)).to(self.device), bc)
        on_model = None if keep_dir is None else (
            lambda c, y: np.save(os.path.join(keep_dir, f"client-{c}.npy"),
                                 y.detach().cpu().numpy()))
        sums, written = train_groups(self.stack, groups, bc_t, lr, t, self.seed,
                                     self._source(t, round_clients), self.store, self.spec,
                                     on_model, self.messages, self.device)
        return {"sums": [(g, acc.to("cpu")) for g, acc in sums], "written": written,
                "seconds": time.perf_counter() - start,
                "store": dict(self.store.stats), "peak_rss_mb": peak_rss_mb(),
                "private_mb": private_mb()}

    @one_at_a_time
    def train_arrays(self, *args) -> dict:
        """:meth:`train`, its sums compact (:meth:`PartialSum.compact`) with their tensors as
        numpy arrays (:func:`as_array`): what a Ray actor sends (``benchmarks/bench_report.py``
        times both against tensors)."""
        report = self.train(*args)
        report["sums"] = [(g, acc.compact().map_values(as_array)) for g, acc in report["sums"]]
        return report

    @one_at_a_time
    def setup_summaries(self, client_ids) -> np.ndarray:
        """The algorithm's one-off per-client summaries (``client_setup``), one row per client."""
        rows = []
        for i in client_ids:
            with calling(name_of(type(self.algorithm), "client_setup"), client=int(i)):
                rows.append(self.algorithm.client_setup(*self.reader.client(int(i))))
        return np.stack([np.asarray(r, dtype=np.float64) for r in rows])

    @one_at_a_time
    @torch.no_grad()
    def client_losses(self, point: np.ndarray, client_ids, batch_size: int,
                      buffers: np.ndarray | None = None) -> np.ndarray:
        """Each client's mean loss on its training rows at ``point`` (with its model
        ``buffers``): power-of-choice's F_k(w^t); writes nothing."""
        w = torch.as_tensor(np.array(point)).to(self.device)
        self.model.set_buffers(None if buffers is None else
                               torch.as_tensor(np.array(buffers)).to(self.device))
        out = np.empty(len(client_ids))
        for row, client in enumerate(np.asarray(client_ids, dtype=np.int64)):
            x, y = self.reader.tensors(*self.reader.client(int(client)), self.device)
            out[row] = float(self.loss_fn(self.model.predict(w, x, batch_size), y))
        return out

    @one_at_a_time
    def client_scores(self, t: int, point: np.ndarray, client_ids, finetune,
                      batch_size: int, buffers: np.ndarray | None = None,
                      versions: np.ndarray | None = None) -> np.ndarray:
        """Per-client evaluation of ``point`` (with its model ``buffers``) on these clients'
        held-out rows (see :func:`~rayfl.runtime.client_eval.score_clients`), and with their
        state ``versions`` of each one's personalised model; writes no client state."""
        w = torch.as_tensor(np.array(point)).to(self.device)
        b = None if buffers is None else torch.as_tensor(np.array(buffers)).to(self.device)
        personal = None if versions is None else self._personal(t, w, client_ids, versions)
        return score_clients(self.model, self.reader, self.loss_fn, self.device, w, client_ids,
                             t, self.seed, finetune, batch_size, b, personal)

    def _personal(self, t: int, w: torch.Tensor, client_ids, versions: np.ndarray):
        """row -> (personalised model, its buffers) of ``client_ids[row]``: the algorithm's
        ``personal_model`` from the client's state version ``versions[row]`` and ``w``."""
        def group(name: str) -> torch.Tensor:
            return self.model.layout.mask(name).to(self.device)

        def personal(row: int):
            client = int(client_ids[row])
            saved = decode(self.store.load(client, int(versions[row])), self.stack)
            where = name_of(type(self.algorithm), "personal_model")
            lent = Lent().add("state", saved.algorithm).add("x", w).add("buffers", saved.buffers)
            with calling(where, t, client):
                own, own_buffers = self.algorithm.personal_model(saved.algorithm, w, group,
                                                                 saved.buffers)
            lent.check(where, t, client)
            return own.to(self.device), \
                None if own_buffers is None else own_buffers.to(self.device)

        return personal


class ClientHost:
    """A client actor's process: the :class:`ClientWorker` of the run whose binding its calls
    carry (``[ObjectRef]`` of the worker's arguments), built on the first call with it. So a
    process serves whichever run it is handed to (:mod:`rayfl.runtime.actor_pool`), and one Ray
    restarted serves its run again."""

    def __init__(self):
        reuse_freed_memory()
        self.bound: str | None = None  # the binding's object, hex
        self.worker: ClientWorker | None = None
        self.binding_lock = threading.Lock()

    def _worker(self, binding: list) -> ClientWorker:
        ref = binding[0]
        with self.binding_lock:
            if self.bound != ref.hex():
                self.worker = None  # the last run's worker is freed before this one is built
                torch.use_deterministic_algorithms(False)  # as in a new process, unless asked
                self.worker, self.bound = ClientWorker(*ray.get(ref)), ref.hex()
            return self.worker

    def ping(self) -> None:
        """An answer: the process is alive and not hung."""

    def ready(self, binding: list) -> dict:
        return self._worker(binding).ready()

    def train_arrays(self, binding: list, *args) -> dict:
        return self._worker(binding).train_arrays(*args)

    def setup_summaries(self, binding: list, client_ids) -> np.ndarray:
        return self._worker(binding).setup_summaries(client_ids)

    def client_losses(self, binding: list, *args) -> np.ndarray:
        return self._worker(binding).client_losses(*args)

    def client_scores(self, binding: list, *args) -> np.ndarray:
        return self._worker(binding).client_scores(*args)

    def release(self, binding: list) -> None:
        """The run of ``binding`` has ended: its worker (model, state cache, data) is freed."""
        with self.binding_lock:
            if self.bound == binding[0].hex():
                self.worker, self.bound = None, None


def bind(worker_args: tuple) -> list:
    """A run's binding: its client workers' arguments put in the object store once, inside a
    list (so Ray hands the reference itself to each call, not the object)."""
    return [ray.put(worker_args)]


# Ray runs two calls of a client actor at once, and they do their work in turn: while one trains
# a group, the call before it sends its answer and the call after it reads its arguments, so
# the actor goes from one group to the next without waiting on Ray.
CALLS_AT_ONCE = 2
ClientActor = ray.remote(max_concurrency=CALLS_AT_ONCE)(ClientHost)
