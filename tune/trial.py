"""One trial on Ray: a placement group reserving its client actors' CPUs/GPUs, and the rayfl run
inside it as a zero-CPU task whose child actors the group captures.

So N parallel trials never hold more than N groups' resources, a trial that cannot be placed
waits for a group to free up, and the same code runs on a laptop's Ray or a cluster. The study
process follows a trial through its run directory's ``metrics.parquet`` (rewritten atomically
after every round) and stops it by cancelling the task and removing the group, which ends the
trial's server and client actors with it.
"""

from __future__ import annotations

import os

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rayfl.config import Config
from rayfl.metrics.tables import read_rows
from rayfl.runtime import actor_pool
from rayfl.simulation import run

STOP_WAIT_S = 10.0  # how long a cancelled run gets to stop its actors before its group goes


@ray.remote(num_cpus=0, max_retries=0)
def _run(cfg: Config, run_dir: str) -> dict:
    """The trial's run; ``cfg`` travels validated, so a component the study's process
    registered (``rayfl.register_algorithm``) comes with it to the worker."""
    return run(cfg, run_dir=run_dir, quiet=True).summary


def bundles(cfg: Config) -> list[dict[str, float]]:
    """One bundle per client actor, exactly what ``rayfl.run`` asks for each actor."""
    rt = cfg.runtime
    bundle = {"CPU": rt.cpus_per_actor, **({"GPU": rt.gpus_per_actor} if rt.gpus_per_actor else {})}
    return [dict(bundle) for _ in range(rt.num_actors)]


class TrialRun:
    """A launched trial: its placement group, its task, and what of its metrics was read."""

    def __init__(self, cfg: Config, run_dir: str, tag: str):
        actor_pool.make_room()  # an idle pooled actor's CPUs are the trial's
        self.pg = placement_group(bundles(cfg), strategy="PACK", name=tag)
        strategy = PlacementGroupSchedulingStrategy(self.pg,
                                                    placement_group_capture_child_tasks=True)
        self.ref = _run.options(scheduling_strategy=strategy, name=tag).remote(cfg, run_dir)
        self.path = os.path.join(run_dir, "metrics.parquet")
        self.seen = 0

    def new_evals(self) -> list[dict]:
        """The evaluated rounds' metrics rows logged since the last call."""
        if not os.path.isfile(self.path):
            return []
        rows = [r for r in read_rows(self.path) if r.get("test_loss") is not None]
        new, self.seen = rows[self.seen:], len(rows)
        return new

    def done(self) -> bool:
        """Whether the run has ended (finished or failed)."""
        return bool(ray.wait([self.ref], timeout=0)[0])

    def summary(self) -> dict:
        """The finished run's summary (raises what the run raised)."""
        return ray.get(self.ref)

    def stop(self) -> None:
        """End the run now: cancel its task (which kills the run's actors as it unwinds), then
        free its group, which ends whatever is left in it."""
        ray.cancel(self.ref)
        ray.wait([self.ref], timeout=STOP_WAIT_S)
        self.release()

    def release(self) -> None:
        """Free the group of a run that has ended, once Ray has placed it: a group removed while
        its bundles are being placed leaks them (ray-project/ray#64693), CPUs no later run
        gets; one still waiting for room after ``STOP_WAIT_S`` is removed as it is."""
        ray.wait([self.pg.ready()], timeout=STOP_WAIT_S)
        remove_placement_group(self.pg)


def fits(cfg: Config) -> int:
    """How many such trials the cluster holds at once (0: not even one)."""
    total = ray.cluster_resources()
    rt = cfg.runtime
    need = {"CPU": rt.num_actors * rt.cpus_per_actor, "GPU": rt.num_actors * rt.gpus_per_actor}
    return int(min(total.get(k, 0.0) / v + 1e-9 for k, v in need.items() if v > 0))
