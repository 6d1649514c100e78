"""Shared fixtures: one local Ray for the session (real actors, 2 CPUs) and tiny configs."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "test", "tiny.yaml")


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance with 2 logical CPUs, shared by every test that needs Ray."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def tiny(tmp_path):
    """Overrides that keep a tiny run's outputs and partition cache inside tmp_path."""
    return [f"output_dir={tmp_path / 'runs'}", f"data.cache_dir={tmp_path / 'cache'}"]
