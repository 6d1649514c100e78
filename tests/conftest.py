"""Shared fixtures: one local Ray for the session (real actors, 2 CPUs) and tiny configs."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "test", "tiny.yaml")

# Ray's raylet prints a line every 10 s once its disk is over 95 % full, and those lines reach
# the stderr the tests read; the suite's outcome must not depend on how full this machine's
# disk happens to be. Set before any Ray starts, here and in the processes the tests spawn.
os.environ["RAY_local_fs_capacity_threshold"] = "1.0"


def three_ways(tiny: list[str], run_dir: str, *overrides: str) -> list:
    """The tiny config for 3 rounds with ``overrides``, run in process, on 2 Ray actors, and in
    process paused after round 2 (in ``run_dir``) then resumed: the three results."""
    import rayfl

    inproc = ["runtime.executor=inprocess", "rounds=3", *overrides]
    return [rayfl.run(TINY, tiny + inproc + ["name=a"], quiet=True),
            rayfl.run(TINY, tiny + ["rounds=3", "runtime.num_actors=2", *overrides, "name=b"],
                      quiet=True),
            rayfl.resume(rayfl.run(TINY, tiny + inproc, run_dir=run_dir, quiet=True,
                                   max_rounds=2).run_dir, quiet=True)]


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance with 2 logical CPUs, shared by every test that needs Ray."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
    yield ray
    ray.shutdown()


_POOL: list = []  # the session's rayfl.runtime.actor_pool.ActorPool, made on first use


def _end_idle_clients() -> None:
    """The session pool's idle client actors ended: their CPUs are free for other actors."""
    if _POOL:
        _POOL[0].close(("client",))


@pytest.fixture(autouse=True)
def warm_actors(request):
    """A test's runs on Ray take the idle server and client actors the session's earlier runs
    left (``rayfl.actor_pool``) instead of starting processes that import torch each; a test
    marked ``fresh_actors`` starts its own, as a run outside a pool does, once the idle client
    actors have ended. Idle client actors keep their CPUs: a test that starts Ray actors of its
    own asks for ``free_cpus`` first."""
    if request.node.get_closest_marker("fresh_actors"):
        _end_idle_clients()
        yield
        return
    from rayfl.runtime.actor_pool import ActorPool

    if not _POOL:
        _POOL.append(ActorPool())
    with _POOL[0]:
        yield


@pytest.fixture
def free_cpus():
    """The session pool's idle client actors ended: their CPUs are for the test's own actors."""
    _end_idle_clients()


def pytest_configure(config):
    config.addinivalue_line("markers", "fresh_actors: the test's runs start their own actors, "
                                       "not the session pool's")


@pytest.fixture
def tiny(tmp_path):
    """Overrides that keep a tiny run's outputs and partition cache inside tmp_path."""
    return [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}"]


@pytest.fixture(scope="session")
def s3_server():
    """A local S3-compatible server (moto) on a free 127.0.0.1 port, stopped at the end.

    Yields ``(uri_for, client)``: ``uri_for(prefix)`` is an ``s3://`` URI of that prefix in the
    test bucket that any process can open (credentials and endpoint ride in the URI), and
    ``client`` is a boto3 client for checking what the server holds independently of pyarrow.
    """
    import logging
    import socket

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    client.create_bucket(Bucket="rayfl-test")

    def uri_for(prefix: str) -> str:
        return (f"s3://testing:testing@rayfl-test/{prefix}?endpoint_override=127.0.0.1:{port}"
                f"&scheme=http&region=us-east-1")

    try:
        yield uri_for, client
    finally:
        server.stop()


def s3_keys(client, prefix: str) -> list[str]:
    """Every object key under ``prefix`` in the test bucket (read with boto3, not pyarrow)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="rayfl-test", Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if a refused input gets as far as starting the run (Ray or the rounds)."""
    from rayfl import simulation

    def started(*_a, **_k):
        raise AssertionError("a refused input started the run")

    monkeypatch.setattr(simulation, "_ensure_ray", started)
    monkeypatch.setattr(simulation, "_execute", started)
