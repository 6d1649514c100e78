"""Ray nodes that cannot see the driver's partition store re-derive it and give the same model
bytes as one node (a real ``ray.cluster_utils.Cluster``), on FedProx's Synthetic(1, 1) with
validation clients held out."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.conftest import ROOT

RAY_ARGS = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False}


@pytest.fixture
def own_ray():
    """Shut down any session Ray for this test's own cluster; restore it afterwards."""
    import ray

    had = ray.is_initialized()
    ray.shutdown()
    yield ray
    ray.shutdown()
    if had:
        ray.init(num_cpus=2, **RAY_ARGS)


def test_two_nodes_rederive_the_partition_and_match_one_node(tmp_path, monkeypatch, own_ray):
    from ray.cluster_utils import Cluster

    from rayfl import simulation

    ray = own_ray
    config = os.path.join(ROOT, "configs", "papers", "fedprox_synthetic.yaml")
    small = [f"output_dir={tmp_path / 'runs'}", "rounds=2", "local.epochs=1",
             "data.num_clients=500", "data.samples_per_client=20", "data.validation_clients=50"]
    monkeypatch.setenv("RAYFL_CACHE", str(tmp_path / "driver"))
    nodes = {name: str(tmp_path / name) for name in ("node1", "node2")}
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "env_vars": {"RAYFL_CACHE": nodes["node1"]}})
    try:
        ray.init(address=cluster.address, **RAY_ARGS)
        one = simulation.run(config, [*small, "runtime.num_actors=1"], quiet=True)

        prepare, hidden = simulation.prepare, []

        def driver_only(cfg, seed):
            """The driver's store exists only on the driver (a laptop driving a cluster)."""
            handle = prepare(cfg, seed)
            shutil.move(handle.path, str(tmp_path / "driver-only"))
            hidden.append(os.path.basename(handle.path))
            return handle

        monkeypatch.setattr(simulation, "prepare", driver_only)
        cluster.add_node(num_cpus=1, env_vars={"RAYFL_CACHE": nodes["node2"]})
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        two = simulation.run(config, [*small, "runtime.num_actors=2"], quiet=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert hidden, "the run no longer calls simulation.prepare: update this test's hook"
    for path in nodes.values():  # one client actor per 1-CPU node, each re-derived the store
        assert os.path.isfile(os.path.join(path, hidden[0], "meta.json"))
    assert two.summary["model_sha256"] == one.summary["model_sha256"]
    assert 0 < one.summary["final_accuracy"] <= 1
