"""Executors: where the round loop's groups of clients train.

:class:`RayExecutor` hands whole groups to client actors (balanced by sample count, one call per
busy actor, the broadcast put in the object store once); :class:`InProcessExecutor` trains them
in this process with the same :class:`~rayfl.runtime.client_actor.ClientWorker` code, for
debugging and notebooks without Ray. Both return the same partial sums, so a config gives the
same model bytes on either.
"""

from __future__ import annotations

import numpy as np
from rayfl.failures import unwrapped
from rayfl.layers import tree_map
from rayfl.runtime.loop import balance


def _numpy(bc):
    """The broadcast tree with numpy arrays (what crosses the object store)."""
    return tree_map(lambda v: v.detach().cpu().numpy(), bc)


class ActorsLost(RuntimeError):
    """A client actor died or hung more often than ``runtime.max_actor_restarts`` allows."""


class RayExecutor:
    """Groups to client actors (named Ray actors hosting many virtual clients).

    An actor that dies mid-round is restarted by Ray (``max_restarts``) and its call re-run
    (``max_task_retries``); one that does not answer within ``timeout_s`` is killed so that the
    same happens, and the re-run gets ``startup_s`` (the actors' own start-up time) on top of the
    deadline. Groups depend only on the sampled set and a client's state versions are written
    once per round, so a re-run gives exactly the bytes the first run would have.
    """

    def __init__(self, actor_names: list[str], sizes: np.ndarray, timeout_s: float | None = None,
                 max_restarts: int = 0, startup_s: float = 0.0):
        import ray

        self.actors = [ray.get_actor(n) for n in actor_names]
        self.sizes, self.timeout_s, self.max_restarts = sizes, timeout_s, max_restarts
        self.startup_s = startup_s
        self.restarts = 0  # actors killed for hanging, over the run

    def _wait(self, refs: list, owners: list) -> list[dict]:
        """Results of ``refs``, killing (so restarting) owners that exceed the deadline."""
        import ray

        pending, deadline = list(refs), self.timeout_s
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=deadline)
            if pending and deadline is not None:
                deadline = self.timeout_s + self.startup_s  # the killed restart first
            for ref in pending:
                self.restarts += 1
                if self.restarts > self.max_restarts * len(self.actors):
                    raise ActorsLost(f"client actors hung {self.restarts} times (over "
                                     f"runtime.actor_timeout_s = {self.timeout_s:g} s)")
                ray.kill(owners[refs.index(ref)], no_restart=False)
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise ActorsLost(f"a client actor died more than runtime.max_actor_restarts = "
                             f"{self.max_restarts} times ({type(e).__name__})") from None
        except ray.exceptions.RayTaskError as e:  # a user's ComponentError: itself, not Ray's
            for ref in refs:  # every other actor's error read too: Ray logs an unread one
                try:
                    ray.get(ref)
                except ray.exceptions.RayError:
                    pass
            raise unwrapped(e) from None

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        import ray

        loads = np.array([sum(int(self.sizes[c]) for c, *_ in tasks) for _, tasks in groups])
        per_actor = balance(loads, len(self.actors))
        bc_ref, clients_ref = ray.put(_numpy(bc)), ray.put(round_clients)
        busy = [(actor, gids) for actor, gids in zip(self.actors, per_actor) if gids]
        calls = [actor.train.remote(t, bc_ref, lr, [groups[g] for g in sorted(gids)], keep_dir,
                                    clients_ref) for actor, gids in busy]
        return self._wait(calls, [actor for actor, _ in busy])

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        chunks = np.array_split(client_ids, len(self.actors))
        return np.concatenate(self._wait([a.setup_summaries.remote(c)
                                          for a, c in zip(self.actors, chunks)], self.actors))

    def client_scores(self, t, point, client_ids, finetune, batch_size,
                      buffers=None, versions=None) -> np.ndarray:
        """Per-client evaluation, the clients (and their state versions) split evenly over
        the actors."""
        import ray

        point_ref, n = ray.put(point), len(self.actors)
        split = zip(np.array_split(client_ids, n),
                    np.array_split(versions, n) if versions is not None else [None] * n)
        busy = [(a, c, v) for a, (c, v) in zip(self.actors, split) if len(c)]
        parts = self._wait([a.client_scores.remote(t, point_ref, c, finetune, batch_size,
                                                   buffers, v) for a, c, v in busy],
                           [a for a, _, _ in busy])
        return np.concatenate(parts) if parts else np.zeros((0, 6))

    def client_losses(self, point, client_ids, batch_size, buffers=None) -> np.ndarray:
        """Power-of-choice's candidate losses, the clients split evenly over the actors."""
        import ray

        point_ref = ray.put(point)
        busy = [(a, c) for a, c in zip(self.actors, np.array_split(client_ids, len(self.actors)))
                if len(c)]
        parts = self._wait([a.client_losses.remote(point_ref, c, batch_size, buffers)
                            for a, c in busy], [a for a, _ in busy])
        return np.concatenate(parts) if parts else np.zeros(0)


class InProcessExecutor:
    """Every group in this process, through one :class:`ClientWorker`."""

    def __init__(self, worker):
        self.worker = worker

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        return [self.worker.train(t, _numpy(bc), lr, groups, keep_dir, round_clients)]

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        return self.worker.setup_summaries(client_ids)

    def client_scores(self, t, point, client_ids, finetune, batch_size,
                      buffers=None, versions=None) -> np.ndarray:
        return self.worker.client_scores(t, point, client_ids, finetune, batch_size, buffers,
                                         versions)

    def client_losses(self, point, client_ids, batch_size, buffers=None) -> np.ndarray:
        return self.worker.client_losses(point, client_ids, batch_size, buffers)
