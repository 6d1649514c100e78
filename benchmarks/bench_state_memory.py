"""Client-state memory at cross-device scale: SCAFFOLD with 100,000 registered clients.

Runs the same SCAFFOLD workload under two state budgets and prints each process's peak RSS, the
state written to disk, and the cache statistics, so one can see that memory follows
``runtime.state_memory_mb``, not the number of clients that hold state.

    python benchmarks/bench_state_memory.py [key=value overrides...]
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile

import rayfl

WORKLOAD = {
    "name": "scaffold-100k", "seed": 0, "rounds": 30, "clients_per_round": 100,
    "data": {"dataset": "synthetic", "num_clients": 100_000, "partition": "iid",
             "features": 20, "classes": 10, "samples_per_client": 20, "test_samples": 2000},
    "model": {"name": "mlp", "hidden": [256, 64]},
    "algorithm": {"name": "scaffold"},
    "local": {"epochs": 1, "batch_size": 10, "lr": 0.05},
    "runtime": {"num_actors": 2, "cpus_per_actor": 1},
    "eval": {"every": 10},
}


def disk_mb(path: str) -> float:
    """Bytes under ``path`` in MiB."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path)
               for f in fs) / 2**20


def measure(budget_mb: float, overrides: list[str], tmp: str) -> dict:
    """One run under a state budget; peak RSS per process kind from the metrics table."""
    result = rayfl.run(WORKLOAD, [f"runtime.state_memory_mb={budget_mb}", *overrides],
                       run_dir=f"{tmp}/budget-{budget_mb:g}", quiet=True)
    rows = result.metrics.to_pylist()
    holders = sum(len(fs) for _, _, fs in os.walk(os.path.join(result.run_dir, "state")))
    return {"budget_mb": budget_mb, "actor_rss_mb": max(r["actor_peak_rss_mb"] for r in rows),
            "server_rss_mb": max(r["server_peak_rss_mb"] for r in rows),
            "clients_with_state": holders,
            "state_on_disk_mb": disk_mb(os.path.join(result.run_dir, "state")),
            "accuracy": result.summary["final_accuracy"]}


def main(argv: list[str]) -> None:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(b, argv, tmp) for b in (16, 256)]
    d = WORKLOAD["data"]
    print(f"SCAFFOLD, {d['num_clients']:,} registered clients, "
          f"{WORKLOAD['clients_per_round']} per round, {WORKLOAD['rounds']} rounds, "
          f"mlp {WORKLOAD['model']['hidden']}")
    print("budget MiB | clients with state | state on disk MiB | peak RSS per actor MiB | "
          "server MiB | accuracy")
    for r in rows:
        print(f"{r['budget_mb']:10g} | {r['clients_with_state']:18,} | "
              f"{r['state_on_disk_mb']:17.1f} | {r['actor_rss_mb']:22.0f} | "
              f"{r['server_rss_mb']:10.0f} | {r['accuracy']:.3f}")
    print(f"driver peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main(sys.argv[1:])
