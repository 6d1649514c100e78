"""What a large cohort costs besides training: seconds a round at 1,000 and 10,000 clients a
round among 100,000 registered (synthetic, 10 rows of 20 features each, logistic regression,
one step of batch 10 a client, FedAvg, 2 actors × 1 CPU), against the floor — the same clients
trained by a plain PyTorch loop (read the client's rows, ``torch.optim.SGD`` on a shuffled
batch, add n·w to the sum) in two single-thread processes at once, each taking half of every
round's clients, as two perfectly efficient workers would on this machine.

rayfl and the floor alternate, in fresh processes, over ``--passes`` passes (this machine's
speed drifts by more than the gaps measured: only side-by-side runs compare). Per pass and
cohort it prints the median seconds of a round (rounds 2 to the last; the first warms up),
the slowest actor's training call, the floor (per round the slower of the two processes), the
overhead (round − floor) and both per client; then each column's min–max over the passes.

    python benchmarks/bench_cohort.py [--clients 100000] [--per-round 1000 10000] [--rounds 5]
        [--passes 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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


def load(clients: int, per_round: int, rounds: int, work: str):
    """The cohort's config and its data store (prepared once under ``work``, then reused)."""
    from rayfl import config
    from rayfl.data import prepare

    raw = json.loads(json.dumps(BASE))
    raw.update(rounds=rounds, clients_per_round=per_round, output_dir=f"{work}/runs")
    raw["data"].update(num_clients=clients, cache_dir=f"{work}/cache")
    cfg = config.load(raw)
    return cfg, prepare(cfg.data, cfg.seed)


class PlainClients:
    """The floor's worker: a plain one-thread loop over a round's clients (read the client's
    rows, ``torch.optim.SGD`` on a shuffled batch, add n·w to the sum)."""

    def __init__(self, cfg, handle):
        import torch

        from rayfl.models import build_for

        torch.set_num_threads(1)
        self.cfg, self.reader = cfg, handle.open()
        torch.manual_seed(cfg.seed)
        self.model = build_for(cfg.model, handle)
        self.params = list(self.model.parameters())
        self.start_w = [p.detach().clone() for p in self.params]

    def round(self, t: int, clients) -> float:
        """Seconds to train ``clients`` in round ``t``."""
        import torch

        model, params, batch = self.model, self.params, self.cfg.local.batch_size
        loss_fn = torch.nn.CrossEntropyLoss()
        tick = time.perf_counter()
        total = [torch.zeros_like(p) for p in params]
        for c in clients:
            x, y = self.reader.tensors(*self.reader.client(int(c)), "cpu")
            with torch.no_grad():
                for p, w in zip(params, self.start_w):
                    p.copy_(w)
            opt = torch.optim.SGD(params, lr=self.cfg.local.lr)
            perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(t + int(c)))
            for b in range(0, len(y), batch):
                idx = perm[b:b + batch]
                opt.zero_grad()
                loss_fn(model(x[idx]), y[idx]).backward()
                opt.step()
            with torch.no_grad():
                for s, p in zip(total, params):
                    s.add_(p, alpha=float(len(y)))
        return time.perf_counter() - tick


def plain_rounds(cfg, handle, rounds: list, barrier) -> list[float]:
    """Seconds of each round of a :class:`PlainClients` loop over its clients; every round
    starts when both processes reach ``barrier``."""
    worker, seconds = PlainClients(cfg, handle), []
    for t, clients in enumerate(rounds):
        barrier.wait()
        seconds.append(worker.round(t, clients))
    return seconds


_BARRIER = None  # a floor process's barrier, shared with its twin (set by _init)


def _init(barrier) -> None:
    global _BARRIER
    _BARRIER = barrier


def _half(args) -> list[float]:
    return plain_rounds(*args, _BARRIER)


def floor(clients: int, per_round: int, rounds: int, work: str) -> dict:
    """Two plain processes at once, each half of every round's clients (rounds as rayfl
    samples them); per round the slower one, median over rounds 2 to the last."""
    from rayfl.availability import make_sampler
    from rayfl.runtime.local import spec_from_config

    cfg, handle = load(clients, per_round, rounds, work)
    sampler = make_sampler(cfg.availability, handle, per_round, cfg.seed,
                           spec_from_config(cfg.local))
    plan = [sampler.plan(t).clients for t in range(rounds)]
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(2)
    with spawn.Pool(2, initializer=_init, initargs=(barrier,)) as pool:
        halves = pool.map(_half, [(cfg, handle, [c[i::2] for c in plan]) for i in (0, 1)], 1)
    return {"floor_s": statistics.median([max(a, b) for a, b in zip(*halves)][1:])}


def rayfl_rounds(clients: int, per_round: int, rounds: int, work: str) -> dict:
    """rayfl's rounds of this cohort on 2 Ray actors."""
    import ray

    from rayfl import simulation

    cfg, _ = load(clients, per_round, rounds, work)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        rows = simulation.run(cfg, quiet=True).metrics.to_pylist()
    finally:
        ray.shutdown()
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    return {"round_s": statistics.median(gaps),
            "actor_s": statistics.median(max(r["actor_train_s"]) for r in rows[1:])}


def child(what: str, args, work: str) -> dict:
    """Run ``what`` (rayfl or floor) for one cohort in a fresh process; its figures."""
    out = subprocess.run([sys.executable, __file__, "--one", what, "--work", work,
                          "--clients", str(args.clients), "--per-round", str(args.per_round[0]),
                          "--rounds", str(args.rounds)], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{what}, {args.per_round[0]} clients a round failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--per-round", type=int, nargs="+", default=[1_000, 10_000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--one", choices=("rayfl", "floor"), help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error(f"--rounds {args.rounds}: expected ≥ 3 (the first round warms up)")
    if args.passes < 1:
        ap.error(f"--passes {args.passes}: expected ≥ 1")
    if args.one:
        run = rayfl_rounds if args.one == "rayfl" else floor
        print(json.dumps(run(args.clients, args.per_round[0], args.rounds, args.work)))
        return
    print(f"{args.clients:,} registered clients, logistic regression, 2 actors × 1 CPU; "
          f"median over rounds 2–{args.rounds}; floor = a plain loop in two single-thread "
          f"processes at once; rayfl and the floor alternate over {args.passes} passes")
    head = (f"{'pass':>4} {'a round':>8} {'s/round':>8} {'slowest actor s':>15} {'floor s':>8} "
            f"{'overhead s':>10} {'ms/client':>9} {'overhead ms/client':>18}")
    print(head)
    seen: dict[int, list] = {n: [] for n in args.per_round}
    with tempfile.TemporaryDirectory(prefix="rayfl-cohort-") as work:
        for p in range(1, args.passes + 1):
            for n in args.per_round:
                one = argparse.Namespace(**{**vars(args), "per_round": [n]})
                r = {**child("rayfl", one, work), **child("floor", one, work)}
                cols = (r["round_s"], r["actor_s"], r["floor_s"], r["round_s"] - r["floor_s"],
                        1000 * r["round_s"] / n, 1000 * (r["round_s"] - r["floor_s"]) / n)
                seen[n].append(cols)
                print(f"{p:>4} {n:>8,} {cols[0]:>8.3f} {cols[1]:>15.3f} {cols[2]:>8.3f} "
                      f"{cols[3]:>10.3f} {cols[4]:>9.3f} {cols[5]:>18.3f}", flush=True)
    print("min–max over the passes")
    for n, rows in seen.items():
        spans = [f"{min(c):.3f}–{max(c):.3f}" for c in zip(*rows)]
        print(f"{'':>4} {n:>8,} " + " ".join(f"{s:>{w}}" for s, w in
                                             zip(spans, (8, 15, 8, 10, 9, 18))))


if __name__ == "__main__":
    main()
