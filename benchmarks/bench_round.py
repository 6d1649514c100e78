"""rayfl's round time against the floor: a plain PyTorch loop training exactly the same clients.

Both sides train the same sampled clients, on the same data, with the same local steps, on the
same total thread count (rayfl: 2 single-thread actors; plain: one process with 2 threads).
Prints the steady-state per-round time ratio rayfl / plain, the share of a rayfl round that is
local training itself (the rest is sampling, dispatch, aggregation and checkpointing), Ray
start-up seconds and peak RSS.

    python benchmarks/bench_round.py [rounds=20] [key=value overrides...]
"""

from __future__ import annotations

import resource
import statistics
import sys
import tempfile
import time

import torch
from torch import nn

import rayfl
from rayfl import config
from rayfl.availability import make_sampler
from rayfl.data import prepare
from rayfl.models import build_model
from rayfl.runtime.local import spec_from_config

WARMUP = 2
BASE = "configs/quickstart.yaml"


def plain_round_times(cfg) -> list[float]:
    """Per-round seconds of a single-process loop (torch threads = the actors' total)."""
    torch.set_num_threads(round(cfg.runtime.num_actors * cfg.runtime.cpus_per_actor))
    handle = prepare(cfg.data, cfg.seed)
    reader = handle.open()
    spec = spec_from_config(cfg.local)
    sampler = make_sampler(cfg.availability, handle, cfg.clients_per_round, cfg.seed, spec)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name, handle.input_shape, handle.num_classes)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for t in range(cfg.rounds):
        start = time.perf_counter()
        lr = cfg.local.lr * cfg.local.lr_decay**t
        total = None
        clients = sampler.plan(t).clients
        for c in clients:
            model.load_state_dict(global_state)
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.local.momentum,
                                  weight_decay=cfg.local.weight_decay)
            x, y = reader.tensors(*reader.client(int(c)), "cpu")
            gen = torch.Generator().manual_seed(cfg.seed * 1000003 + t * 1009 + int(c))
            for _ in range(cfg.local.epochs):
                perm = torch.randperm(len(y), generator=gen)
                for b in range(0, len(y), cfg.local.batch_size):
                    idx = perm[b:b + cfg.local.batch_size]
                    opt.zero_grad()
                    loss_fn(model(x[idx]), y[idx]).backward()
                    opt.step()
            n = len(y)
            sd = model.state_dict()
            total = {k: v * n for k, v in sd.items()} if total is None else {
                k: total[k] + sd[k] * n for k in sd}
        weight = sum(int(handle.sizes()[c]) for c in clients)
        global_state = {k: v / weight for k, v in total.items()}
        times.append(time.perf_counter() - start)
    return times


def rayfl_round_times(cfg) -> tuple[list[float], float]:
    """Per-round seconds of rayfl (steady state: wall time between consecutive rounds)."""
    import ray

    start = time.perf_counter()
    ray.init(num_cpus=round(cfg.runtime.num_actors * cfg.runtime.cpus_per_actor),
             include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    startup = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        result = rayfl.run(cfg, run_dir=f"{tmp}/run", quiet=True)
    ray.shutdown()
    rows = result.metrics.to_pylist()
    elapsed = [r["elapsed_s"] for r in rows]
    gaps = [b - a for a, b in zip(elapsed, elapsed[1:])]
    # the share of each round the slowest actor spent training clients (1.0: no overhead at all)
    busy = [r["actor_train_s_max"] / g for r, g in zip(rows[1:], gaps)]
    return gaps, busy, startup


def main(argv: list[str]) -> None:
    overrides = ["rounds=20", f"eval.every={10**6}", "checkpoint.every=1", *argv]
    cfg = config.load(BASE, overrides)
    # the last round evaluates; keep it out of the steady state
    rf, busy, startup = rayfl_round_times(cfg)
    rf, busy = rf[WARMUP - 1:-1], busy[WARMUP - 1:-1]
    pl = plain_round_times(cfg)[WARMUP:-1]
    r_med, p_med = statistics.median(rf), statistics.median(pl)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"workload: {cfg.model.name} on {cfg.data.dataset}, {cfg.clients_per_round} clients/"
          f"round, {cfg.local.epochs} epoch(s), batch {cfg.local.batch_size}, "
          f"{cfg.runtime.num_actors} actors x {cfg.runtime.cpus_per_actor:g} CPU")
    print(f"plain PyTorch loop (floor): {p_med:.3f} s/round (median of {len(pl)})")
    print(f"rayfl:                      {r_med:.3f} s/round (median of {len(rf)})")
    print(f"ratio rayfl / plain:        {r_med / p_med:.3f}")
    print(f"local training share:       {statistics.median(busy):.3f} of each rayfl round "
          f"(slowest actor's training seconds / round seconds, median)")
    print(f"ray start-up:               {startup:.2f} s")
    print(f"peak RSS (driver process):  {peak_mb:.0f} MiB")


if __name__ == "__main__":
    main(sys.argv[1:])
