"""Where a client's time goes besides training: rayfl's client path (a client actor's body,
``ClientWorker.train``, run in this process) against the cohort's plain loop
(``bench_cohort.PlainClients``: read the rows, ``torch.optim.SGD`` on a shuffled batch, add n·w
to the sum) on the same clients, in one process with one torch thread, alternating chunk by
chunk; each side's microseconds a client are the minimum over the chunks (this machine's speed
drifts by more than the gap measured; the minimum is the run least disturbed). Then the pieces
of the path that are not the model's forward and backward, each timed alone the same way.

    python benchmarks/bench_client_path.py [--clients 100000] [--chunk 400] [--chunks 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import timeit

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cohort import PlainClients, load  # noqa: E402


def pieces(worker, bc) -> dict[str, float]:
    """Microseconds of each per-client piece of the path that is not training, alone."""
    from rayfl import rng
    from rayfl.contract import Lent
    from rayfl.runtime.aggregate import PartialSum

    x = bc.algorithm["x"]
    delta, acc, cpu = x.clone(), PartialSum(), torch.device("cpu")
    rows = worker.reader.round(0, None)
    tests = {
        "the client's minibatch generator (rng.client_stream)":
            lambda: rng.client_stream(0, 3, 12345),
        "torch's generator seeded for the client (rng.seed_torch)":
            lambda: rng.seed_torch(0, 3, 12345, cpu),
        "its rows as tensors (store slice + torch.from_numpy)":
            lambda: worker.reader.tensors(*rows.client(7), cpu),
        "its upload added to the group's sums (PartialSum.add_client)":
            lambda: acc.add_client(5, delta, 1.0, 1, 10, 0.5, {}, []),
        "the lent tensors held read-only (contract.Lent)":
            lambda: Lent().add("x", x).add("bc", {}).add("state", None).check("w", 1, 2),
    }
    return {name: min(timeit.repeat(f, number=5000, repeat=5)) / 5000 * 1e6
            for name, f in tests.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--chunk", type=int, default=400)
    ap.add_argument("--chunks", type=int, default=30)
    args = ap.parse_args()
    if args.chunks < 2 or args.chunk < 1 or args.chunk > args.clients:
        ap.error("expected --chunks ≥ 2 and 1 ≤ --chunk ≤ --clients")
    from rayfl.assemble import worker_parts
    from rayfl.runtime.client_actor import ClientWorker
    from rayfl.runtime.executors import numpy_tree

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="rayfl-client-path-") as work:
        cfg, handle = load(args.clients, args.chunk, 3, work)
        parts = worker_parts(cfg, handle.num_clients)
        worker = ClientWorker(parts, handle, os.path.join(work, "state"), 2**30)
        plain = PlainClients(cfg, handle)
        bc = parts.stack.broadcast(parts.stack.init(worker.model.w.detach().clone()), 0)
        sent = numpy_tree(bc)
        draw = np.random.default_rng(0)
        rayfl_us, plain_us = [], []
        for t in range(args.chunks):
            clients = np.sort(draw.choice(args.clients, args.chunk, replace=False))
            groups = [(0, [(int(c), 1.0, -1, None) for c in clients])]
            tick = time.perf_counter()
            worker.train(t, sent, cfg.local.lr, groups)
            rayfl_us.append((time.perf_counter() - tick) / args.chunk * 1e6)
            plain_us.append(plain.round(t, clients) / args.chunk * 1e6)
        print(f"{args.chunks} chunks of {args.chunk} clients (of {args.clients:,}), logistic "
              "regression, one step of batch 10 a client, one process, one torch thread")
        lo_r, lo_p = min(rayfl_us), min(plain_us)
        print(f"rayfl's client path: {lo_r:.1f} µs a client (median {np.median(rayfl_us):.1f})")
        print(f"plain loop:          {lo_p:.1f} µs a client (median {np.median(plain_us):.1f})")
        print(f"besides training: {lo_r - lo_p:.1f} µs a client ({lo_r / lo_p:.3f}×); "
              f"at 10,000 clients on 2 actors {(lo_r - lo_p) * 5000 / 1e6:.3f} s a round")
        print("per-client pieces alone, µs:")
        for name, us in pieces(worker, bc).items():
            print(f"  {us:6.1f}  {name}")


if __name__ == "__main__":
    main()
