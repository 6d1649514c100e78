"""Population scale: partition a synthetic population and run rounds at 10k–1M clients.

Each size runs in a fresh process, so its peak memory is its own. Per size it prints: seconds to
partition and write the store (``prepare``), seconds of ``rayfl.run`` (Ray start, actors, the
rounds), the median seconds of a round (wall time between consecutive rounds, the first left
out), the mean checkpoint seconds, the client state on disk, the driver's, the server actor's
and the largest client actor's peak RSS (an actor's includes the pages of the memory-mapped
store it read: shared, reclaimable), a client actor's own (anonymous) memory after its last
round, and the peak of the summed RSS of the driver and every
process under it (Ray's daemons and actors; shared pages of the mapped store count once per
process, so this over-states real use).

    python benchmarks/bench_population.py [--clients 10000 100000 1000000] [--rounds 2]
        [--algorithm fedavg] [--per-round 10]

The scale table of the README: ``--algorithm scaffold --per-round 100 --rounds 50``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BASE = {
    "name": "population", "seed": 0, "clients_per_round": 10,
    "data": {"dataset": "synthetic", "partition": "label_dirichlet", "alpha": 0.3,
             "samples_per_client": 10, "features": 20, "classes": 10, "test_samples": 1000},
    "model": {"name": "logreg"},
    "local": {"epochs": 1, "batch_size": 10, "lr": 0.1},
    "runtime": {"num_actors": 2, "cpus_per_actor": 1},
}


PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """Bytes resident in process ``root`` and all its descendants (Linux ``/proc``)."""
    parent = {}
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        tree.update(kids)
        frontier = kids
    total = 0
    for p in tree:
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except OSError:
            continue
    return total


def disk_mb(path: str) -> float:
    """Bytes under ``path`` in MiB (0 when it does not exist)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path)
               for f in fs) / 2**20


def measure(clients: int, rounds: int, algorithm: str, per_round: int, work: str) -> dict:
    """Prepare and run one population size in this process; returns the figures."""
    from rayfl import config, simulation
    from rayfl.data import prepare

    me, peak, done = os.getpid(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(me))
            time.sleep(0.1)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    raw = json.loads(json.dumps(BASE))
    raw.update(rounds=rounds, clients_per_round=per_round, algorithm={"name": algorithm})
    raw["output_dir"] = os.path.join(work, "runs")
    raw["data"].update(num_clients=clients, cache_dir=os.path.join(work, "cache"))
    cfg = config.load(raw)
    tick = time.perf_counter()
    handle = prepare(cfg.data, cfg.seed)
    prepare_s = time.perf_counter() - tick
    prepare_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tick = time.perf_counter()
    result = simulation.run(cfg, quiet=True)
    run_s = time.perf_counter() - tick
    done.set()
    watcher.join()
    store_mb = sum(os.path.getsize(os.path.join(handle.path, f)) for f in os.listdir(handle.path))
    rows = result.metrics.to_pylist()
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    checkpoints = [r["checkpoint_s"] for r in rows[1:]]
    return {"clients": clients, "rows": int(handle.sizes().sum()), "store_mb": store_mb / 2**20,
            "prepare_s": prepare_s, "run_s": run_s, "rounds": rounds,
            "round_s": statistics.median(gaps[1:] or gaps),
            "checkpoint_s": statistics.mean(checkpoints) if checkpoints else 0.0,
            "state_mb": disk_mb(os.path.join(result.run_dir, "state")),
            "actor_peak_rss_mb": max(r["actor_peak_rss_mb"] for r in rows),
            "actor_private_mb": max(r["actor_private_mb"] for r in rows),
            "server_peak_rss_mb": max(r["server_peak_rss_mb"] for r in rows),
            "driver_peak_rss_mb_after_prepare": prepare_rss,
            "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "tree_peak_rss_mb": max(peak[0], tree_rss(me)) / 2**20,
            "model_sha256": result.summary["model_sha256"][:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--algorithm", default="fedavg")
    ap.add_argument("--per-round", type=int, default=BASE["clients_per_round"])
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    if args.one:
        work = tempfile.mkdtemp(prefix="rayfl-population-")
        try:
            print(json.dumps(measure(args.clients[0], args.rounds, args.algorithm,
                                     args.per_round, work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    d = BASE["data"]
    print(f"synthetic {d['partition']}(α={d['alpha']}), {d['samples_per_client']} samples × "
          f"{d['features']} features per client, {BASE['model']['name']}, {args.algorithm}, "
          f"{args.per_round} clients/round, {args.rounds} rounds, "
          f"{BASE['runtime']['num_actors']} actors; MB are MiB")
    print(f"{'clients':>9} {'store MB':>8} {'prepare s':>9} {'run s':>6} {'s/round':>7} "
          f"{'ckpt s':>6} {'state MB':>8} {'driver MB':>9} {'server MB':>9} {'actor MB':>8} "
          f"{'actor own':>9} {'all MB':>7}")
    for n in args.clients:
        out = subprocess.run([sys.executable, __file__, "--one", "--clients", str(n),
                              "--rounds", str(args.rounds), "--algorithm", args.algorithm,
                              "--per-round", str(args.per_round)], capture_output=True,
                             text=True)
        if out.returncode:
            sys.exit(f"{n} clients failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['clients']:>9} {r['store_mb']:>8.0f} {r['prepare_s']:>9.2f} {r['run_s']:>6.1f} "
              f"{r['round_s']:>7.3f} {r['checkpoint_s']:>6.3f} {r['state_mb']:>8.1f} "
              f"{r['driver_peak_rss_mb']:>9.0f} {r['server_peak_rss_mb']:>9.0f} "
              f"{r['actor_peak_rss_mb']:>8.0f} {r['actor_private_mb']:>9.0f} "
              f"{r['tree_peak_rss_mb']:>7.0f}", flush=True)


if __name__ == "__main__":
    main()
