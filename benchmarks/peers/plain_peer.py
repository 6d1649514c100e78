"""The floor: the reference workload as a plain loop in ``--workers`` single-thread processes.

No framework: each round the driver splits the planned clients between the workers (longest
first, onto the least-loaded worker), each worker trains its clients from the global weights
in shared memory and adds n_i·w_i into its own shared accumulator, and the driver sums the
accumulators in worker order. What is left besides training is a pipe message each way per
worker per round — the least a two-process simulator can do.

    python benchmarks/peers/plain_peer.py --workload W.npz --out R.json [--rounds N] [--workers 2]
"""

from __future__ import annotations

import os
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import arguments, RoundTimer, Workload, build_model, client_seed, report, train_client  # noqa: E402


def split(clients, sizes, workers: int) -> list[list[int]]:
    """Longest client first onto the least-loaded worker (ties: the lower worker)."""
    loads, parts = [0] * workers, [[] for _ in range(workers)]
    for c in sorted(clients, key=lambda c: (-sizes[c], c)):
        w = loads.index(min(loads))
        parts[w].append(c)
        loads[w] += sizes[c]
    return parts


def worker(path: str, shared: dict, accumulator: dict, conn) -> None:
    """Train each round's clients from ``shared``; leave Σ n_i·w_i in ``accumulator``."""
    torch.set_num_threads(1)
    data, model = Workload.load(path), build_model()
    params = dict(model.named_parameters())
    conn.send("ready")
    while (job := conn.recv()) is not None:
        t, clients = job
        for v in accumulator.values():
            v.zero_()
        samples = 0
        for c in clients:
            with torch.no_grad():
                for k, p in params.items():
                    p.copy_(shared[k])
            x, y = data.client(c)
            n = train_client(model, x, y, client_seed(t, c))
            samples += n
            with torch.no_grad():
                for k, p in params.items():
                    accumulator[k].add_(p, alpha=float(len(y)))
        conn.send(samples)


def main(argv=None) -> None:
    parser = arguments(__doc__)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = Workload.load(args.workload)
    rounds = args.rounds or len(data.plan)
    sizes = {c: data.size(c) for c in range(data.num_clients)}
    model = build_model()
    shared = {k: p.detach().clone().share_memory_() for k, p in model.named_parameters()}
    accumulators = [{k: torch.zeros_like(p).share_memory_() for k, p in shared.items()}
                    for _ in range(args.workers)]
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for acc in accumulators:
        here, there = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(args.workload, shared, acc, there), daemon=True)
        proc.start()
        pipes.append(here)
        procs.append(proc)
    assert all(conn.recv() == "ready" for conn in pipes)
    timer = RoundTimer()
    for t in range(rounds):
        planned = [int(c) for c in data.plan[t]]
        for conn, part in zip(pipes, split(planned, sizes, args.workers)):
            conn.send((t, part))
        samples = sum(conn.recv() for conn in pipes)
        total = sum(sizes[c] for c in planned)
        with torch.no_grad():
            for k, v in shared.items():
                v.copy_(sum(acc[k] for acc in accumulators) / total)
        timer.tick(samples)
    for conn, proc in zip(pipes, procs):
        conn.send(None)
        proc.join()
    report(args.out, "plain loop", timer.rounds,
           note=f"{args.workers} spawned processes × 1 thread, weights in shared memory")
    state = model.state_dict()
    torch.save({k: shared[k].clone() if k in shared else v for k, v in state.items()},
               args.out + ".pt")


if __name__ == "__main__":
    main()
