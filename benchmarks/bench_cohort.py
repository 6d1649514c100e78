"""What a large cohort costs besides training: seconds a round at 1,000 and 10,000 clients a
round among 100,000 registered (synthetic, 10 rows of 20 features each, logistic regression,
one step of batch 10 a client, FedAvg, 2 actors × 1 CPU), against the floor — the same clients
trained by a plain PyTorch loop in one thread (read the client's rows, ``torch.optim.SGD`` on a
shuffled batch, add n·w to the sum), whose seconds divided by the actors are what two perfectly
parallel workers need.

Per cohort it prints the median seconds of a round (rounds 2 to the last; the first warms up),
the floor, the overhead (round − floor) and both per client. Each cohort runs in a fresh process.

    python benchmarks/bench_cohort.py [--clients 100000] [--per-round 1000 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

BASE = {
    "name": "cohort", "seed": 0,
    "data": {"dataset": "synthetic", "partition": "label_dirichlet", "alpha": 0.3,
             "samples_per_client": 10, "features": 20, "classes": 10, "test_samples": 1000},
    "model": {"name": "logreg"},
    "local": {"epochs": 1, "batch_size": 10, "lr": 0.1},
    "runtime": {"num_actors": 2, "cpus_per_actor": 1},
    "eval": {"every": 10**6},
}


def floor_seconds(cfg, handle, rounds: list) -> float:
    """Median seconds of a plain one-thread loop training each round's clients."""
    import torch

    from rayfl.models import build_for

    torch.set_num_threads(1)
    reader = handle.open()
    torch.manual_seed(cfg.seed)
    model = build_for(cfg.model, handle)
    params = list(model.parameters())
    start_w = [p.detach().clone() for p in params]
    loss_fn, batch = torch.nn.CrossEntropyLoss(), cfg.local.batch_size
    seconds = []
    for t, clients in enumerate(rounds):
        tick = time.perf_counter()
        total = [torch.zeros_like(p) for p in params]
        for c in clients:
            x, y = reader.tensors(*reader.client(int(c)), "cpu")
            with torch.no_grad():
                for p, w in zip(params, start_w):
                    p.copy_(w)
            opt = torch.optim.SGD(params, lr=cfg.local.lr)
            perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(t + int(c)))
            for b in range(0, len(y), batch):
                idx = perm[b:b + batch]
                opt.zero_grad()
                loss_fn(model(x[idx]), y[idx]).backward()
                opt.step()
            with torch.no_grad():
                for s, p in zip(total, params):
                    s.add_(p, alpha=float(len(y)))
        seconds.append(time.perf_counter() - tick)
    return statistics.median(seconds)


def measure(clients: int, per_round: int, rounds: int) -> dict:
    """One cohort in this process: rayfl's rounds on Ray, then the floor on the same clients."""
    import ray

    from rayfl import config, simulation
    from rayfl.availability import make_sampler
    from rayfl.data import prepare
    from rayfl.runtime.local import spec_from_config

    with tempfile.TemporaryDirectory() as work:
        raw = json.loads(json.dumps(BASE))
        raw.update(rounds=rounds, clients_per_round=per_round, output_dir=f"{work}/runs")
        raw["data"].update(num_clients=clients, cache_dir=f"{work}/cache")
        cfg = config.load(raw)
        handle = prepare(cfg.data, cfg.seed)
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        try:
            rows = simulation.run(cfg, quiet=True).metrics.to_pylist()
        finally:
            ray.shutdown()
        gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
        sampler = make_sampler(cfg.availability, handle, per_round, cfg.seed,
                               spec_from_config(cfg.local))
        plan = [sampler.plan(t).clients for t in range(1, rounds)]
        floor = floor_seconds(cfg, handle, plan)
    return {"clients": clients, "per_round": per_round, "round_s": statistics.median(gaps),
            "actor_s": statistics.median(max(r["actor_train_s"]) for r in rows[1:]),
            "floor_s": floor / cfg.runtime.num_actors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--per-round", type=int, nargs="+", default=[1_000, 10_000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error(f"--rounds {args.rounds}: expected ≥ 3 (the first round warms up)")
    if args.one:
        print(json.dumps(measure(args.clients, args.per_round[0], args.rounds)))
        return
    print(f"{args.clients:,} registered clients, logistic regression, 2 actors × 1 CPU; "
          f"median over rounds 2–{args.rounds}; floor = a plain one-thread loop on the same "
          "clients ÷ 2 actors")
    print(f"{'a round':>8} {'s/round':>8} {'slowest actor s':>15} {'floor s':>8} "
          f"{'overhead s':>10} {'ms/client':>9} {'overhead ms/client':>18}")
    for n in args.per_round:
        out = subprocess.run([sys.executable, __file__, "--one", "--clients", str(args.clients),
                              "--per-round", str(n), "--rounds", str(args.rounds)],
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{n} clients a round failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        over = r["round_s"] - r["floor_s"]
        print(f"{n:>8,} {r['round_s']:>8.3f} {r['actor_s']:>15.3f} {r['floor_s']:>8.3f} "
              f"{over:>10.3f} {1000 * r['round_s'] / n:>9.3f} {1000 * over / n:>18.3f}",
              flush=True)


if __name__ == "__main__":
    main()
