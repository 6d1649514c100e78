"""Executors: where the round loop's groups of clients train.

An executor is a component (``runtime.executor``, registry kind ``executor``): a class with
``on_ray`` (whether the run starts Ray, client actors and a server actor for it), optionally
``copies_parts`` (whether its workers get the run's parts pickled, so the pre-flight checks the
user's components pickle), and ``build(hosting)``, which makes it in the server from a
:class:`Hosting`; the instance answers the calls of :class:`~rayfl.runtime.loop.Executor`.
:class:`RayExecutor` hands groups to client actors as they free up (largest first, the
broadcast put in the object store once, each actor given its next group in hand just before
it finishes the one it trains: ``Pacer``);
:class:`InProcessExecutor` trains them in this process with the same
``rayfl.runtime.client_actor.ClientWorker`` code, for debugging and notebooks without Ray;
:class:`rayfl.runtime.threads.ThreadExecutor` trains them on threads of this process. All
return the same partial sums, so a config gives the same model bytes on each.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import ray

from rayfl.failures import unwrapped
from rayfl.layers import tree_map
from rayfl.runtime.aggregate import as_tensor
from rayfl.runtime.client_actor import ClientWorker, WorkerParts


@dataclass(frozen=True)
class Hosting:
    """What an executor is built from in the server: the client workers' parts as the driver
    built them, the partition store's handle, where client state lives, the ``runtime``
    section, the clients' sizes, and (``on_ray`` executors) the client actors the driver
    started, with when it started them (``time.time()`` on the driver's node, where the server
    runs) and the run's binding their calls carry (``rayfl.runtime.client_actor.bind``)."""

    parts: WorkerParts
    handle: Any
    state_root: str
    runtime: Any  # rayfl.runtime.config.RuntimeConfig
    sizes: np.ndarray
    actors: list | None = None
    started_at: float | None = None
    binding: list | None = None

    def worker(self, share: int = 1) -> ClientWorker:
        """A client worker in this process with 1/``share`` of the state memory budget."""
        return ClientWorker(self.parts, self.handle, self.state_root,
                            self.runtime.state_memory_mb * 2**20 / share)


def numpy_tree(bc):
    """The broadcast tree with numpy arrays (what crosses the object store)."""
    return tree_map(lambda v: v.detach().cpu().numpy(), bc)


def combined(reports: list[dict]) -> dict:
    """One actor's reports of a round's calls as one: its groups' sums and clients written in
    the order it trained them, its training seconds added, its memory at the peak and last."""
    return {"sums": [pair for r in reports for pair in r["sums"]],
            "written": [c for r in reports for c in r["written"]],
            "seconds": sum(r["seconds"] for r in reports), "store": reports[-1]["store"],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in reports),
            "private_mb": reports[-1]["private_mb"]}


def tensors_of(report: dict) -> dict:
    """An actor's report (:meth:`ClientWorker.train_arrays`) with its sums' arrays as
    tensors again, and expanded (:meth:`PartialSum.expand`)."""
    report["sums"] = [(g, acc.map_values(as_tensor).expand()) for g, acc in report["sums"]]
    return report


def group_loads(groups: list, sizes: np.ndarray) -> list[int]:
    """Each group's samples (the sum of its clients' sizes): what its training time goes by."""
    return [sum(int(sizes[c]) for c, *_ in tasks) for _, tasks in groups]


def heaviest_first(groups: list, sizes: np.ndarray) -> deque:
    """The groups' positions in the order workers take them: most samples first, ties by
    position."""
    loads = group_loads(groups, sizes)
    return deque(sorted(range(len(groups)), key=lambda g: (-loads[g], g)))


class Pacer:
    """When a client actor gets its next group in hand: ``LEAD_S`` before it is expected to
    finish the one it trains, from its seconds per sample so far (before it has answered a
    call, at once).

    A group handed to an actor still training a heavy one waits there, while another actor may
    run dry and idle to the end of the round; handing it over just in time leaves every group
    but the ones in hand to whichever actor frees up first, as threads take them. Which actor
    trains a group changes nothing in its sum."""

    LEAD_S = 0.04  # more than a call takes to reach a busy actor
    KEEP = 0.9  # the weight of an actor's earlier calls in its rate, each call

    def __init__(self, actors: int):
        self.seconds = [0.0] * actors  # each actor's training seconds and samples, the
        self.samples = [0.0] * actors  # earlier calls' weighed down by KEEP each call

    def learn(self, a: int, seconds: float, samples: int) -> None:
        """Actor ``a`` trained ``samples`` in ``seconds``. Its rate is the ratio of the sums
        (a small client's fixed costs do not make a large one look slow)."""
        self.seconds[a] = self.KEEP * self.seconds[a] + seconds
        self.samples[a] = self.KEEP * self.samples[a] + samples

    def due(self, a: int, began: float, samples: int) -> float:
        """When actor ``a``, which began ``samples`` at ``began`` (``time.monotonic()``), gets
        its next group in hand."""
        if not self.samples[a]:
            return began
        return began + samples * self.seconds[a] / self.samples[a] - self.LEAD_S


class ActorsLost(RuntimeError):
    """A client actor died or hung more often than ``runtime.max_actor_restarts`` allows."""


class RayExecutor:
    """Groups to client actors (Ray actors hosting many virtual clients).

    Each call carries the run's ``binding``, from which a client actor (``ClientHost``) builds
    the run's worker.

    An actor that dies mid-round is restarted by Ray (``max_restarts``) and its call re-run
    (``max_task_retries``); one that answers no call for ``timeout_s`` is killed so that the
    same happens, and the re-run gets ``startup_s`` (how long the actors took to start, from the
    driver starting them to their first answer) on top of the deadline. Groups depend only on the sampled set and a client's state versions are written
    once per round, so a re-run gives exactly the bytes the first run would have.
    """

    def __init__(self, actors: list, sizes: np.ndarray, timeout_s: float | None = None,
                 max_restarts: int = 0, startup_s: float = 0.0, binding: list | None = None):
        self.actors, self.binding = actors, binding
        self.sizes, self.timeout_s, self.max_restarts = sizes, timeout_s, max_restarts
        self.startup_s = startup_s
        self.restarts = 0  # actors killed for hanging, over the run
        self.pacer = Pacer(len(self.actors))

    on_ray: ClassVar[bool] = True
    copies_parts: ClassVar[bool] = True  # each actor gets the parts pickled

    @classmethod
    def build(cls, hosting: Hosting) -> "RayExecutor":
        """The executor on the actors the driver started (the server starts beside them): once
        they are ready, how long they took is what a restarted one gets on top of the
        deadline."""
        rt = hosting.runtime
        try:  # the driver waited for them too: one gone since is lost, and named so
            ray.get([a.ready.remote(hosting.binding) for a in hosting.actors])
        except ray.exceptions.RayActorError as e:
            raise ActorsLost(f"a client actor stopped before the first round "
                             f"({type(e).__name__})") from None
        # never below 0: under Ray Client the driver's clock is another machine's
        startup_s = 0.0 if hosting.started_at is None else \
            max(0.0, time.time() - hosting.started_at)
        return cls(hosting.actors, hosting.sizes, rt.actor_timeout_s,
                   rt.max_actor_restarts, startup_s, hosting.binding)

    def _wait(self, refs: list, owners: list) -> list[dict]:
        """Results of ``refs`` in order, killing (so restarting) owners that exceed the
        deadline."""
        pending, deadline = list(refs), self.timeout_s
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=deadline)
            if pending and deadline is not None:
                deadline = self.timeout_s + self.startup_s  # the killed restart first
            for ref in pending:
                self._kill(owners[refs.index(ref)])
        results = []
        for i, ref in enumerate(refs):
            results.append(self._get(ref, refs[i + 1:]))
        return results

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        """Each actor takes the next group, heaviest first, as soon as it is free, and gets
        one more in hand when the ``Pacer`` expects it to finish (an actor trains one call at
        a time, and goes to the one in hand while its answer to the last goes out): an actor
        on a slower (or busier) core trains fewer groups, and no actor idles while groups
        wait. Which actor trains a group changes nothing in its sum. One report per actor
        that trained, its calls combined. When groups fail, the error raised is the lowest
        group's (every lower group is run to know): the one the in-process executor, which
        trains the groups in order, raises."""
        queue, loads = heaviest_first(groups, self.sizes), group_loads(groups, self.sizes)
        bc_ref, clients_ref = ray.put(numpy_tree(bc)), ray.put(round_clients)
        running: dict = {}  # call -> (actor index, group), in the order given
        deadlines: dict = {}  # actor index -> when it counts as hung (None: never)
        training: dict = {}  # actor index -> (when it began its group, that group's samples)
        done: list[list[dict]] = [[] for _ in self.actors]
        failed: dict = {}  # group -> its error

        def held(a: int) -> list[int]:
            return [g for owner, g in running.values() if owner == a]

        def give(a: int) -> None:
            g = queue.popleft()
            if a not in deadlines:  # an idle actor: the clock starts now
                deadlines[a] = self._deadline(self.timeout_s)
                training[a] = (time.monotonic(), loads[g])
            call = self.actors[a].train_arrays.remote(self.binding, t, bc_ref, lr, [groups[g]],
                                                      keep_dir, clients_ref)
            running[call] = (a, g)

        def in_hand_due() -> dict:  # actor -> when it gets a group in hand (queue non-empty)
            return {a: self.pacer.due(a, *training[a]) for a in range(len(self.actors))
                    if queue and len(held(a)) == 1}

        for a in range(len(self.actors)):  # a group to train each, heaviest first
            if queue:
                give(a)
        while running:
            for a, due in in_hand_due().items():
                if due <= time.monotonic() and queue:
                    give(a)
            call = self._next(running, deadlines, min(in_hand_due().values(), default=None))
            if call is None:
                continue
            a, g = running.pop(call)
            del deadlines[a]
            if held(a):  # its group in hand: it trains that now
                deadlines[a] = self._deadline(self.timeout_s)
                training[a] = (time.monotonic(), loads[held(a)[0]])
            try:
                report = tensors_of(ray.get(call))
                done[a].append(report)
                self.pacer.learn(a, report["seconds"], loads[g])
            except ray.exceptions.RayActorError as e:
                raise self._lost(e) from None
            except ray.exceptions.RayTaskError as e:  # a user's ComponentError, say
                failed[g] = e
                queue = deque(h for h in queue if h < min(failed))
            if queue and not held(a):
                give(a)
        if failed:
            raise unwrapped(failed[min(failed)]) from None
        return [combined(reports) for reports in done if reports]

    @staticmethod
    def _deadline(seconds: float | None) -> float | None:
        return None if seconds is None else time.monotonic() + seconds

    def _next(self, running: dict, deadlines: dict, wake: float | None = None):
        """The first call of ``running`` to finish; None at ``wake`` (``time.monotonic()``),
        or after killing (so restarting) the actors that answered nothing by their deadline
        (``timeout_s`` after their last answer, or after they were given a call when idle);
        they then get ``startup_s`` more."""
        pending = [d for d in [*deadlines.values(), wake] if d is not None]
        wait = None if not pending else max(0.0, min(pending) - time.monotonic())
        ready, _ = ray.wait(list(running), num_returns=1, timeout=wait)
        if ready:
            return ready[0]
        now = time.monotonic()
        for a, deadline in list(deadlines.items()):
            if deadline is not None and deadline <= now:
                self._kill(self.actors[a])
                deadlines[a] = self._deadline(self.timeout_s + self.startup_s)
        return None

    def _kill(self, actor) -> None:
        """Kill a hung actor so Ray restarts it and re-runs its call; ActorsLost past the
        allowance."""
        self.restarts += 1
        if self.restarts > self.max_restarts * len(self.actors):
            raise ActorsLost(f"client actors hung {self.restarts} times (over "
                             f"runtime.actor_timeout_s = {self.timeout_s:g} s)")
        ray.kill(actor, no_restart=False)

    def _lost(self, e: Exception) -> ActorsLost:
        return ActorsLost(f"a client actor died more than runtime.max_actor_restarts = "
                          f"{self.max_restarts} times ({type(e).__name__})")

    def _get(self, call, others: list):
        """A finished call's result; the user's ComponentError itself for a failed one (every
        other call read first: Ray logs an error nobody read), ActorsLost for a dead actor."""
        try:
            return ray.get(call)
        except ray.exceptions.RayActorError as e:
            raise self._lost(e) from None
        except ray.exceptions.RayTaskError as e:
            for ref in others:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError:
                    pass
            raise unwrapped(e) from None

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        chunks = np.array_split(client_ids, len(self.actors))
        return np.concatenate(self._wait([a.setup_summaries.remote(self.binding, c)
                                          for a, c in zip(self.actors, chunks)], self.actors))

    def client_scores(self, t, point, client_ids, finetune, batch_size,
                      buffers=None, versions=None) -> np.ndarray:
        """Per-client evaluation, the clients (and their state versions) split evenly over
        the actors."""
        point_ref, n = ray.put(point), len(self.actors)
        split = zip(np.array_split(client_ids, n),
                    np.array_split(versions, n) if versions is not None else [None] * n)
        busy = [(a, c, v) for a, (c, v) in zip(self.actors, split) if len(c)]
        parts = self._wait([a.client_scores.remote(self.binding, t, point_ref, c, finetune,
                                                   batch_size, buffers, v) for a, c, v in busy],
                           [a for a, _, _ in busy])
        return np.concatenate(parts) if parts else np.zeros((0, 6))

    def client_losses(self, point, client_ids, batch_size, buffers=None) -> np.ndarray:
        """Power-of-choice's candidate losses, the clients split evenly over the actors."""
        point_ref = ray.put(point)
        busy = [(a, c) for a, c in zip(self.actors, np.array_split(client_ids, len(self.actors)))
                if len(c)]
        parts = self._wait([a.client_losses.remote(self.binding, point_ref, c, batch_size, buffers)
                            for a, c in busy], [a for a, _ in busy])
        return np.concatenate(parts) if parts else np.zeros(0)


class InProcessExecutor:
    """Every group in this process, one after another, through one client worker (no Ray:
    debugging, notebooks)."""

    on_ray: ClassVar[bool] = False
    copies_parts: ClassVar[bool] = False

    def __init__(self, worker: ClientWorker):
        self.worker = worker

    @classmethod
    def build(cls, hosting: Hosting) -> "InProcessExecutor":
        return cls(hosting.worker())

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        return [self.worker.train(t, numpy_tree(bc), lr, groups, keep_dir, round_clients)]

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        return self.worker.setup_summaries(client_ids)

    def client_scores(self, t, point, client_ids, finetune, batch_size,
                      buffers=None, versions=None) -> np.ndarray:
        return self.worker.client_scores(t, point, client_ids, finetune, batch_size, buffers,
                                         versions)

    def client_losses(self, point, client_ids, batch_size, buffers=None) -> np.ndarray:
        return self.worker.client_losses(point, client_ids, batch_size, buffers)
