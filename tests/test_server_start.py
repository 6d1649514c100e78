"""Building the server writes nothing: its run's state is made (or restored) when the run is asked
for, so a server the driver stops before that leaves the run as it found it; a client actor gone
between the driver's wait for it and the server's is named as lost."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import TINY


def _files(root) -> dict[str, bytes]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            path = os.path.join(d, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def test_building_the_server_writes_nothing_and_its_run_begins_with_the_run(tiny, tmp_path):
    from rayfl import assemble, config, simulation
    from rayfl.runtime.server import Server

    cfg = config.load(TINY, tiny + ["runtime.executor=inprocess", "rounds=1",
                                    "loggers.tensorboard=true"])
    run_dir = tmp_path / "run"
    leftover = run_dir / "state" / "leftover.bin"  # a run never checkpointed left it
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"x")
    before = _files(run_dir)
    parts = simulation.preflight(cfg)
    settings = assemble.server_settings(cfg, parts.handle.num_clients, parts.x, str(run_dir))
    server = Server(parts, settings, str(run_dir), None)
    assert _files(run_dir) == before

    summary = server.run()
    assert summary["rounds"] == 1 and not leftover.exists()
    assert os.listdir(run_dir / "tensorboard")  # the logger opened with the first row


def test_a_client_actor_gone_before_the_server_starts_is_lost_not_the_servers_error(ray_local):
    import ray

    from rayfl.runtime.executors import ActorsLost, Hosting, RayExecutor

    @ray.remote(num_cpus=0)
    class Actor:
        def ready(self, binding) -> dict:
            return {}

    actor = Actor.remote()
    ray.get(actor.ready.remote(None))  # the driver's wait
    ray.kill(actor, no_restart=True)
    for _ in range(1000):  # until it is gone: a call sent before the kill lands still answers
        try:
            ray.get(actor.ready.remote(None))
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the killed actor still answers")
    runtime = SimpleNamespace(actor_timeout_s=None, max_actor_restarts=0)
    hosting = Hosting(None, None, "", runtime, np.ones(1), [actor], None)
    with pytest.raises(ActorsLost, match="a client actor stopped before the first round"):
        RayExecutor.build(hosting)
