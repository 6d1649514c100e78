"""``rayfl.actor_pool``: runs inside take the processes of the runs before them, with the bytes of
fresh actors (a run in process has those: test_inprocess_executor_gives_the_ray_executors_bytes);
a failed run's actors, a dead idle one and idle ones of other resources are not handed out; a
pooled actor Ray restarts mid-run serves that run."""

from __future__ import annotations

import json
import os

import psutil
import pytest

import rayfl
from tests.conftest import TINY

pytestmark = pytest.mark.fresh_actors  # the pools here are the tests' own


def _pids(result_or_dir) -> dict[str, int]:
    run_dir = getattr(result_or_dir, "run_dir", result_or_dir)
    with open(os.path.join(run_dir, "actors.json")) as f:
        return {name: p["pid"] for name, p in json.load(f).items()}


def _gone(pid: int, grace_s: float = 60.0) -> bool:
    """Whether the process ``pid`` has ended, within ``grace_s`` (Ray ends a killed actor's
    process a moment later)."""
    try:
        psutil.Process(pid).wait(timeout=grace_s)
    except psutil.NoSuchProcess:
        pass
    except psutil.TimeoutExpired:
        return False
    return True


def test_runs_in_a_pool_share_their_actors_and_give_a_fresh_runs_bytes(ray_local, tiny):
    fresh = rayfl.run(TINY, tiny + ["name=fresh", "runtime.executor=inprocess"], quiet=True)
    with rayfl.actor_pool() as pool:
        first = rayfl.run(TINY, tiny + ["name=first", "algorithm.name=scaffold"], quiet=True)
        second = rayfl.run(TINY, tiny + ["name=second"], quiet=True)
        assert _pids(second) == _pids(first)  # the same two processes, by the same names
        assert second.summary["model_sha256"] == fresh.summary["model_sha256"]
        other = rayfl.run(TINY, tiny + ["name=other", "runtime.cpus_per_actor=0.5"], quiet=True)
        assert not set(_pids(other).values()) & set(_pids(first).values())
        assert all(_gone(pid) for pid in _pids(first).values())  # ended to free their CPUs
        idle = [actor for pairs in pool.idle.values() for _, actor in pairs]
        assert len(idle) == 3  # the last run's two client actors and the server
    assert all(_gone(pid) for pid in _pids(other).values())  # leaving the pool ends them


def test_a_failed_runs_actors_and_a_dead_idle_one_are_not_handed_out(ray_local, tiny):
    import ray

    with rayfl.actor_pool() as pool:
        def stop(info):
            raise KeyboardInterrupt  # the user's Ctrl-C after round 1

        with pytest.raises(KeyboardInterrupt):
            broken = str(tiny[0].split("=", 1)[1]) + "/broken"
            rayfl.run(TINY, tiny, run_dir=broken, quiet=True, on_round=stop)
        assert all(_gone(pid) for pid in _pids(broken).values())
        assert pool.idle == {}
        first = rayfl.run(TINY, tiny + ["name=first"], quiet=True)
        [(name, actor)] = [pair for key, pairs in pool.idle.items() if key[0] == "client"
                           for pair in pairs if pair[0] == min(_pids(first))]
        ray.kill(actor)
        second = rayfl.run(TINY, tiny + ["name=second"], quiet=True)
        assert name not in _pids(second) and len(_pids(second)) == 2
        assert second.summary["model_sha256"] == first.summary["model_sha256"]


def test_a_pooled_actor_killed_mid_run_comes_back_serving_that_run(ray_local, tiny, tmp_path,
                                                                   monkeypatch):
    """The actors of a run that faulted nothing (its marker was there) go to the next run with
    the same fault setting; one of them is killed in its round 1 and restarted by Ray, bound to
    the second run by that run's calls: the clean bytes."""
    clean = rayfl.run(TINY, tiny + ["name=clean", "rounds=3", "runtime.executor=inprocess"],
                      quiet=True)
    marker = tmp_path / "fault-marker"
    monkeypatch.setenv("RAYFL_FAULT", f"kill:1:{marker}")
    marker.touch()
    with rayfl.actor_pool():
        first = rayfl.run(TINY, tiny + ["name=first", "rounds=3", "seed=5"], quiet=True)
        marker.unlink()
        faulted = rayfl.run(TINY, tiny + ["name=faulted", "rounds=3"], quiet=True)
    assert marker.exists()  # the fault happened
    assert set(_pids(faulted)) == set(_pids(first))  # in the first run's actors
    assert faulted.summary["model_sha256"] == clean.summary["model_sha256"]
