"""Runs whose client state and checkpoints live on an S3 server (moto, started by the tests):
one local Ray, and a two-node ``ray.cluster_utils.Cluster`` whose nodes share nothing but that
server; both give the same model bytes as a run on local disk."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import rayfl
from tests.conftest import TINY, s3_keys
from tests.test_data_cluster import RAY_ARGS, own_ray  # noqa: F401,F811  (fixture)

SCAFFOLD = ["algorithm.name=scaffold", "rounds=5", "clients_per_round=6"]  # per-client state


def _stored(client, prefix: str) -> tuple[list[str], list[str]]:
    keys = s3_keys(client, prefix)
    return ([k for k in keys if "/checkpoints/" in k],
            [k for k in keys if "/state/" in k and k.endswith(".npz")])


def test_state_and_checkpoints_on_s3_pause_resume_match_local_disk(ray_local, tiny, tmp_path,
                                                                   s3_server):
    uri_for, client = s3_server
    local = rayfl.run(TINY, tiny + SCAFFOLD + ["runtime.executor=inprocess"], quiet=True)
    on_s3 = tiny + SCAFFOLD + [f"runtime.storage={uri_for('single')}",
                               "runtime.state_memory_mb=0"]  # every state read back from S3
    run_dir = str(tmp_path / "s3-run")
    paused = rayfl.run(TINY, on_s3, run_dir=run_dir, quiet=True, max_rounds=2)
    assert paused.summary["status"] == "paused"
    checkpoints, states = _stored(client, "single/s3-run/")
    assert checkpoints == ["single/s3-run/checkpoints/checkpoint.pt"] and states
    resumed = rayfl.resume(run_dir, quiet=True)
    assert resumed.summary["model_sha256"] == local.summary["model_sha256"]
    assert not {"state", "checkpoints"} & set(os.listdir(run_dir))  # nothing on local disk
    assert "checkpoints" in os.listdir(local.run_dir)


@pytest.mark.fresh_actors  # each run's own server actor is placed
def test_two_nodes_sharing_only_s3_match_one_node(tmp_path, monkeypatch, own_ray, s3_server):
    """Each node has its own data cache (re-derived there) and nothing but the S3 server in
    common for client state and checkpoints; the run is paused and resumed on the cluster. The
    driver's node has no CPUs (KubeRay's usual head), so only the server actor runs there: it
    must, since it writes the run directory the user reads."""
    from ray.cluster_utils import Cluster
    from ray._private.state import actors as actor_table

    from rayfl import simulation

    ray = own_ray
    uri_for, client = s3_server
    small = [f"output_dir={tmp_path / 'runs'}", *SCAFFOLD]
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "driver"))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "env_vars": {"RAYFL_CACHE": str(tmp_path / "head")}})
    cluster.add_node(num_cpus=1, env_vars={"RAYFL_CACHE": str(tmp_path / "node1")})
    try:
        ray.init(address=cluster.address, **RAY_ARGS)
        driver_node, head_node = ray.get_runtime_context().get_node_id(), cluster.head_node.node_id
        one = rayfl.run(TINY, [*small, "runtime.num_actors=1"], quiet=True)
        prepare, hidden = simulation.prepare, []

        def driver_only(cfg, seed):
            """The driver's data store is moved out of the nodes' sight once it is made."""
            handle = prepare(cfg, seed)
            hidden.append(str(tmp_path / f"driver-only-{len(hidden)}"))
            shutil.move(handle.path, hidden[-1])
            return handle

        monkeypatch.setattr(simulation, "prepare", driver_only)
        cluster.add_node(num_cpus=1, env_vars={"RAYFL_CACHE": str(tmp_path / "node2")})
        assert len([n for n in ray.nodes() if n["Alive"]]) == 3
        two_dir = str(tmp_path / "two")
        two = [*small, "runtime.num_actors=2", f"runtime.storage={uri_for('cluster')}",
               "runtime.state_memory_mb=0"]  # every state read back from S3, by either node
        paused = rayfl.run(TINY, two, run_dir=two_dir, quiet=True, max_rounds=3)
        with open(os.path.join(two_dir, "actors.json")) as f:
            nodes = {a["node_id"] for a in json.load(f).values()}
        resumed = rayfl.resume(two_dir, quiet=True)
        # the actor table of the cluster this driver is connected to, read from its GCS (the
        # state API would need the dashboard, which may fail to start on a loaded machine)
        servers = [a["Address"]["NodeID"] for a in actor_table().values()
                   if a["ActorClassName"] == "ServerHost"]
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert driver_node == head_node
    assert servers == [driver_node] * 3  # one, paused and resumed: all where the user reads
    assert paused.summary["status"] == "paused" and len(nodes) == 2  # one actor per node
    assert driver_node not in nodes
    assert len(hidden) == 2, "the run no longer calls simulation.prepare: update this test"
    for node in ("node1", "node2"):  # each node derived its own copy of the data
        assert os.listdir(tmp_path / node)
    checkpoints, states = _stored(client, "cluster/two/")
    assert checkpoints == ["cluster/two/checkpoints/checkpoint.pt"] and states
    assert not {"state", "checkpoints"} & set(os.listdir(two_dir))
    assert resumed.summary["model_sha256"] == one.summary["model_sha256"]
