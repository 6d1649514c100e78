"""The thread-pool executor (``runtime.executor: threads``): groups train on
``runtime.num_actors`` threads of the server's process, no Ray at all.

Each thread owns a ``rayfl.runtime.client_actor.ClientWorker`` built from its own copy
of the run's parts (pickled, as a Ray actor gets them), so no two threads share a model,
a component or a state cache; PyTorch releases the interpreter lock inside its kernels, so the
threads train at once. They share torch's one generator, so a model whose training forward
draws from it (dropout) is refused before the run: its draws would depend on the threads'
timing. Groups are taken heaviest first as threads free up, exactly as client
actors take them, and each group's sum depends only on its clients: the model bytes are the
other executors'.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import replace
from typing import Callable, ClassVar

import numpy as np
from ray import cloudpickle

from rayfl.runtime.client_actor import ClientWorker
from rayfl.runtime.executors import Hosting, combined, heaviest_first, numpy_tree


class ThreadExecutor:
    """Groups to threads of this process, one client worker each."""

    on_ray: ClassVar[bool] = False
    copies_parts: ClassVar[bool] = True
    shares_torch_generator: ClassVar[bool] = True  # a model that draws from it is refused

    def __init__(self, workers: list[ClientWorker], sizes: np.ndarray):
        self.workers, self.sizes = workers, sizes
        self.lock = threading.Lock()  # guards a round's queue of groups

    @classmethod
    def build(cls, hosting: Hosting) -> "ThreadExecutor":
        n = hosting.runtime.num_actors  # each worker's parts its own, pickled as an actor's
        return cls([replace(hosting, parts=cloudpickle.loads(cloudpickle.dumps(hosting.parts)))
                    .worker(n) for _ in range(n)], hosting.sizes)

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        """Each thread takes the next group, heaviest first, when free; one report per thread
        that trained. When groups fail, the lowest group's error is raised (every lower group
        is run to know), as with the other executors."""
        queue = heaviest_first(groups, self.sizes)
        bc_np = numpy_tree(bc)
        failed: dict[int, BaseException] = {}
        done: list[list[dict]] = [[] for _ in self.workers]

        def next_group() -> int | None:
            with self.lock:
                return queue.popleft() if queue else None

        def drain(w: int) -> None:
            while (g := next_group()) is not None:
                try:
                    done[w].append(self.workers[w].train(t, bc_np, lr, [groups[g]], keep_dir,
                                                         round_clients))
                except BaseException as e:  # noqa: BLE001 - raised in the caller's thread
                    with self.lock:
                        failed[g] = e
                        kept = [h for h in queue if h < min(failed)]
                        queue.clear()
                        queue.extend(kept)

        self._on_threads([lambda w=w: drain(w) for w in range(len(self.workers))], queue)
        if failed:
            raise failed[min(failed)]
        return [combined(reports) for reports in done if reports]

    def _on_threads(self, calls: list[Callable[[], None]], queue: deque | None = None) -> None:
        """Run ``calls`` at once, one thread each, and wait for all; on the caller's Ctrl-C the
        ``queue`` is emptied and the threads are waited for after their current group (none
        writes after the run has stopped)."""
        threads = [threading.Thread(target=call, daemon=True) for call in calls]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        except BaseException:
            if queue is not None:
                with self.lock:
                    queue.clear()
            for thread in threads:
                thread.join()
            raise

    def _split(self, call: Callable[[ClientWorker, np.ndarray, np.ndarray | None], np.ndarray],
               client_ids: np.ndarray, versions: np.ndarray | None = None) -> list[np.ndarray]:
        """``call(worker, clients, versions)`` over the clients split evenly across the
        threads, the parts in client order."""
        n = len(self.workers)
        chunks = np.array_split(np.asarray(client_ids), n)
        split = np.array_split(versions, n) if versions is not None else [None] * n
        busy = [w for w in range(n) if len(chunks[w])]
        parts: list = [None] * n
        errors: list[tuple[int, BaseException]] = []

        def one(w: int) -> None:
            try:
                parts[w] = call(self.workers[w], chunks[w], split[w])
            except BaseException as e:  # noqa: BLE001 - raised below, the lowest chunk's first
                errors.append((w, e))

        self._on_threads([lambda w=w: one(w) for w in busy])
        if errors:
            raise min(errors, key=lambda pair: pair[0])[1]
        return [parts[w] for w in busy]

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        return np.concatenate(self._split(lambda w, c, _: w.setup_summaries(c), client_ids))

    def client_scores(self, t, point, client_ids, finetune, batch_size,
                      buffers=None, versions=None) -> np.ndarray:
        parts = self._split(lambda w, c, v: w.client_scores(t, point, c, finetune, batch_size,
                                                            buffers, v), client_ids, versions)
        return np.concatenate(parts) if parts else np.zeros((0, 6))

    def client_losses(self, point, client_ids, batch_size, buffers=None) -> np.ndarray:
        parts = self._split(lambda w, c, _: w.client_losses(point, c, batch_size, buffers),
                            client_ids)
        return np.concatenate(parts) if parts else np.zeros(0)
