"""A run's actors on Ray: its client actors bound to the run and placed, its server actor
started, and at the end either ended or (inside :func:`rayfl.actor_pool`) handed back."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray

from rayfl.metrics.files import write_json
from rayfl.runtime import actor_pool, storage
from rayfl.runtime.client_actor import ClientActor, bind
from rayfl.runtime.placement import on_driver_node
from rayfl.runtime.server import ServerActor


@dataclass
class RunActors:
    """The server (``started``: its ``start`` call), the client (name, actor)s, the binding
    their calls carry, and what a pool files them under."""

    server: tuple[str, Any]
    clients: list[tuple[str, Any]]
    binding: list
    token: str
    started: Any
    client_options: dict
    server_options: dict
    pool: actor_pool.ActorPool | None

    def end(self, clean: bool) -> None:
        """A run that ended cleanly hands its actors back to the pool it took them from (each
        frees the run's objects); otherwise, or without a pool, they are ended."""
        server = self.server[1]
        if not (clean and self.pool is not None):
            for actor in [server, *(a for _, a in self.clients)]:
                ray.kill(actor)
            return
        server.release.remote(self.token)
        for _, actor in self.clients:
            actor.release.remote(self.binding)
        self.pool.give_back("server", self.server_options, [self.server])
        self.pool.give_back("client", self.client_options, self.clients)


def start(cfg, parts, settings, run_dir: str, resume: bool) -> RunActors:
    """The run's client actors (the pool's idle ones first), each bound to the run and asked
    where it landed (``actors.json``), and its server actor started beside them."""
    rt = cfg.runtime
    tag, pool = os.path.basename(run_dir), actor_pool.current()
    budget = rt.state_memory_mb * 2**20 / rt.num_actors
    env = {k: os.environ[k] for k in ("RAYFL_FAULT",) if k in os.environ}  # fault injection
    client_options = dict(num_cpus=rt.cpus_per_actor, num_gpus=rt.gpus_per_actor,
                          max_restarts=rt.max_actor_restarts,
                          max_task_retries=rt.max_actor_restarts,
                          runtime_env={"env_vars": env} if env else None)
    server_options = {"node": ray.get_runtime_context().get_node_id()}
    began = time.time()  # the server, on this node, times the actors' start-up from it

    def new_client(name: str):
        return ClientActor.options(name=name, **client_options).remote()

    def new_server(name: str):
        return ServerActor.options(name=name, **on_driver_node()).remote()

    if pool is None:
        clients = [(n, new_client(n)) for n in
                   (f"rayfl/{tag}/client-{i}" for i in range(rt.num_actors))]
        server = (f"rayfl/{tag}/server", new_server(f"rayfl/{tag}/server"))
    else:
        clients = pool.take("client", client_options, rt.num_actors, new_client)
        [server] = pool.take("server", server_options, 1, new_server)
    binding = bind((parts.worker, parts.handle, storage.state_root_of(settings.location),
                    budget))
    token = uuid.uuid4().hex
    # a pool's actors started before: a restarted one gets as long as those took
    started_at = began - (pool.startup_s if pool is not None else 0.0)
    actors = RunActors(server, clients, binding, token, None, client_options, server_options,
                       pool)
    try:
        # the server's process starts beside the actors', not after them
        actors.started = server[1].start.remote(token, parts, settings, run_dir,
                                                [a for _, a in clients], resume, started_at,
                                                binding)
        placement = ray.get([a.ready.remote(binding) for _, a in clients])
        write_json({n: p for (n, _), p in zip(clients, placement)},
                   os.path.join(run_dir, "actors.json"))
    except BaseException:
        actors.end(clean=False)
        raise
    if pool is not None:
        pool.startup_s = max(pool.startup_s, time.time() - began)
    return actors
