"""Executors: where the round loop's groups of clients train.

:class:`RayExecutor` hands whole groups to client actors (balanced by sample count, one call per
busy actor, the broadcast put in the object store once); :class:`InProcessExecutor` trains them
in this process with the same :class:`~rayfl.runtime.client_actor.ClientWorker` code, for
debugging and notebooks without Ray. Both return the same partial sums, so a config gives the
same model bytes on either.
"""

from __future__ import annotations

import numpy as np
import torch

from rayfl.runtime.loop import balance


def _numpy(bc: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in bc.items()}


class RayExecutor:
    """Groups to client actors (named Ray actors hosting many virtual clients)."""

    def __init__(self, actor_names: list[str], sizes: np.ndarray):
        import ray

        self.actors = [ray.get_actor(n) for n in actor_names]
        self.sizes = sizes

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        import ray

        loads = np.array([sum(int(self.sizes[c]) for c, *_ in tasks) for _, tasks in groups])
        per_actor = balance(loads, len(self.actors))
        bc_ref, clients_ref = ray.put(_numpy(bc)), ray.put(round_clients)
        calls = [actor.train.remote(t, bc_ref, lr, [groups[g] for g in sorted(gids)], keep_dir,
                                    clients_ref)
                 for actor, gids in zip(self.actors, per_actor) if gids]
        return ray.get(calls)

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        import ray

        chunks = np.array_split(client_ids, len(self.actors))
        return np.concatenate(ray.get([a.setup_summaries.remote(c)
                                       for a, c in zip(self.actors, chunks)]))


class InProcessExecutor:
    """Every group in this process, through one :class:`ClientWorker`."""

    def __init__(self, worker):
        self.worker = worker

    def run(self, t, bc, lr, groups, keep_dir, round_clients) -> list[dict]:
        return [self.worker.train(t, _numpy(bc), lr, groups, keep_dir, round_clients)]

    def summaries(self, client_ids: np.ndarray) -> np.ndarray:
        return self.worker.setup_summaries(client_ids)
