"""What being inside a Ray actor costs the same training code: the cohort's plain client loop
(``bench_cohort.PlainClients``) in two Ray actors × 1 CPU against the same loop in two plain
single-thread processes, each pair training the two halves of the same round's clients,
alternating round by round (this machine's speed drifts by more than the gap measured).

Per round it prints both pairs' seconds (the slower of each two) and their ratio, then the
median and min–max ratio, and the CPU that everything else on the machine took while the
actors trained (Ray's raylet, GCS and agents, the driver, the kernel), as a share of the two
cores, read from ``/proc``.

    python benchmarks/bench_actor_pair.py [--clients 100000] [--per-round 10000] [--rounds 12]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cohort import PlainClients, load  # noqa: E402


def cpu_ticks() -> dict[int, int]:
    """User + system clock ticks of every process now running, by pid."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(pid)] = int(fields[11]) + int(fields[12])
    return out


def _serve(conn, cfg, handle) -> None:
    """A plain process: train the halves it is sent until it is sent None."""
    worker = PlainClients(cfg, handle)
    while (job := conn.recv()) is not None:
        conn.send(worker.round(*job))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--per-round", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    if args.rounds < 2:
        ap.error(f"--rounds {args.rounds}: expected ≥ 2 (the first round warms up)")
    import ray

    from rayfl.availability import make_sampler
    from rayfl.runtime.local import spec_from_config

    with tempfile.TemporaryDirectory(prefix="rayfl-actor-pair-") as work:
        cfg, handle = load(args.clients, args.per_round, args.rounds, work)
        sampler = make_sampler(cfg.availability, handle, args.per_round, cfg.seed,
                               spec_from_config(cfg.local))
        plan = [sampler.plan(t).clients for t in range(args.rounds)]
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        try:
            actors = [ray.remote(num_cpus=1)(PlainClients).remote(cfg, handle)
                      for _ in range(2)]
            pids = set(ray.get([a.__ray_call__.remote(lambda self: os.getpid())
                                for a in actors]))
            spawn = multiprocessing.get_context("spawn")
            pipes = []
            for _ in range(2):
                here, there = spawn.Pipe()
                spawn.Process(target=_serve, args=(there, cfg, handle), daemon=True).start()
                pipes.append(here)
            print(f"{args.per_round:,} clients a round of {args.clients:,}, logistic "
                  "regression; the same loop in two Ray actors and in two plain processes, "
                  "alternating by round")
            print(f"{'round':>5} {'plain pair s':>12} {'actor pair s':>12} {'actor/plain':>11}")
            ratios, others, wall = [], 0, 0.0
            for t, clients in enumerate(plan):
                halves = [clients[0::2], clients[1::2]]
                for pipe, half in zip(pipes, halves):
                    pipe.send((t, half))
                plain = max(pipe.recv() for pipe in pipes)
                before, tick = cpu_ticks(), time.perf_counter()
                actor = max(ray.get([a.round.remote(t, half) for a, half in zip(actors, halves)]))
                after, took = cpu_ticks(), time.perf_counter() - tick
                if t:  # the first round warms up
                    ratios.append(actor / plain)
                    wall += took
                    others += sum(after[p] - before.get(p, 0) for p in after if p not in pids)
                print(f"{t + 1:>5} {plain:>12.3f} {actor:>12.3f} {actor / plain:>11.3f}",
                      flush=True)
            for pipe in pipes:
                pipe.send(None)
        finally:
            ray.shutdown()
    share = others / os.sysconf("SC_CLK_TCK") / (2 * wall)
    print(f"actor/plain over rounds 2–{args.rounds}: median {statistics.median(ratios):.3f}, "
          f"min–max {min(ratios):.3f}–{max(ratios):.3f}; everything else took "
          f"{100 * share:.1f} % of the two cores while the actors trained")


if __name__ == "__main__":
    main()
