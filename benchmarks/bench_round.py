"""Training throughput of rayfl against the floor: a plain PyTorch loop training the same clients.

Every line trains the same sampled clients, on the same data, with the same local steps, and
reports samples trained per second over the steady rounds (the first rounds warm up, the last
evaluates). The plain loop is what a user would write: one process, ``torch.optim.SGD``, the
model as built (NCHW), with 2 threads, 1 thread, and 2 threads in channels-last layout (rayfl's
default, ``model.channels_last``). rayfl runs 2 single-thread actors and 1 actor with 2 CPUs;
for the first it prints each actor's samples and busy seconds a round, the imbalance (max/mean
of the actors' busy seconds), the share of a round the slowest actor trains, how long the
actors stood idle while the round trained, and what the server does between rounds.

    python benchmarks/bench_round.py [--workloads reference,wide,cifar] [key=value ...]

Overrides apply to every line (e.g. ``runtime.gpus_per_actor=0.5``: actors train on CUDA, and
so does the plain loop when torch sees a GPU).
"""

from __future__ import annotations

import argparse
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

BASE = "configs/quickstart.yaml"
WARMUP = 2  # rounds left out at the start (the last round, which evaluates, is left out too)

WORKLOADS = {
    "reference": ("FMNIST CNN, 100 clients Dirichlet(0.1), 10 a round", [], 20),
    "wide": ("FMNIST CNN, 1,000 clients of 60 rows with Dirichlet(0.1) label mixes, 100 a round",
             ["data.num_clients=1000", "data.partition=label_dirichlet", "clients_per_round=100"],
             7),
    "cifar": ("CIFAR CNN (1.0 M parameters), CIFAR-shaped synthetic images, 100 clients, "
              "10 a round",
              ["data.dataset=benchmarks.cifar_shaped:CifarShaped", "data.samples_per_client=300",
               "data.test_samples=500", "model.name=cifar_cnn"], 8),
}


def window(rounds: int) -> range:
    """The steady rounds (0-based) every line is measured over."""
    return range(WARMUP, rounds - 1)


def plain_rounds(cfg, threads: int, channels_last: bool) -> list[tuple[int, float]]:
    """(samples, seconds) of each round of a single-process loop with ``threads`` threads."""
    torch.set_num_threads(threads)
    device = torch.device("cuda" if cfg.runtime.gpus_per_actor > 0 and torch.cuda.is_available()
                          else "cpu")
    handle = prepare(cfg.data, cfg.seed)
    reader = handle.open()
    sampler = make_sampler(cfg.availability, handle, cfg.clients_per_round, cfg.seed,
                           spec_from_config(cfg.local))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model.name, handle.input_shape, handle.num_classes).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    loss_fn, sizes, out = nn.CrossEntropyLoss(), handle.sizes(), []
    for t in range(cfg.rounds):
        start = time.perf_counter()
        lr = cfg.local.lr * cfg.local.lr_decay**t
        total = None
        clients = sampler.plan(t).clients
        for c in clients:
            model.load_state_dict(global_state)
            opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.local.momentum,
                                  weight_decay=cfg.local.weight_decay)
            x, y = reader.tensors(*reader.client(int(c)), device)
            gen = torch.Generator().manual_seed(cfg.seed * 1000003 + t * 1009 + int(c))
            for _ in range(cfg.local.epochs):
                perm = torch.randperm(len(y), generator=gen).to(device)
                for b in range(0, len(y), cfg.local.batch_size):
                    idx = perm[b:b + cfg.local.batch_size]
                    opt.zero_grad()
                    loss_fn(model(x[idx]), y[idx]).backward()
                    opt.step()
            sd, n = model.state_dict(), len(y)
            total = {k: v * n for k, v in sd.items()} if total is None else {
                k: total[k] + sd[k] * n for k in sd}
        samples = int(sizes[clients].sum())
        global_state = {k: v / samples for k, v in total.items()}
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append((samples, time.perf_counter() - start))
    return out


def rayfl_rows(cfg) -> tuple[list[dict], float]:
    """rayfl's metrics rows (each with ``gap_s``, the wall time since the previous round ended)
    and the seconds Ray took to start."""
    import ray

    start = time.perf_counter()
    ray.init(num_cpus=max(1, round(cfg.runtime.num_actors * cfg.runtime.cpus_per_actor)),
             num_gpus=None, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    startup = time.perf_counter() - start
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = rayfl.run(cfg, run_dir=f"{tmp}/run", quiet=True).metrics.to_pylist()
    finally:
        ray.shutdown()
    for prev, row in zip(rows, rows[1:]):
        row["gap_s"] = row["elapsed_s"] - prev["elapsed_s"]
    return rows, startup


def rate(pairs) -> float:
    """Samples per second over (samples, seconds) pairs."""
    return sum(n for n, _ in pairs) / sum(s for _, s in pairs)


def actor_breakdown(rows: list[dict]) -> list[str]:
    """Per-actor samples, busy seconds and speed; imbalance; training share; idle actors;
    server time."""
    actors = len(rows[0]["actor_samples"])
    lines = ["  actor  samples/round  busy s/round  samples/s"]
    for a in range(actors):
        n = sum(r["actor_samples"][a] for r in rows)
        s = sum(r["actor_train_s"][a] for r in rows)
        lines.append(f"  {a:5d}  {n / len(rows):13,.0f}  {s / len(rows):12.3f}  {n / s:9,.0f}")
    share = sum(r["actor_train_s_max"] for r in rows) / sum(r["gap_s"] for r in rows)
    between = [r["gap_s"] - r["train_s"] for r in rows]
    idle = statistics.median(actors * r["train_s"] - sum(r["actor_train_s"]) for r in rows)
    parts = {k: statistics.mean(r.get(k) or 0.0 for r in rows)
             for k in ("plan_s", "aggregate_s", "checkpoint_s")}
    lines += [
        f"  imbalance (max/mean busy seconds), median over rounds: "
        f"{statistics.median(r['actor_imbalance'] for r in rows):.3f}",
        f"  slowest actor's training / round time: {share:.3f}",
        f"  actors idle while the round trains (actors × training − busy seconds), median over "
        f"rounds: {idle:.3f} core-s",
        f"  between rounds (round − training): {statistics.mean(between):.3f} s a round "
        f"(sampling {parts['plan_s']:.3f}, merge + server update {parts['aggregate_s']:.3f}, "
        f"checkpoint {parts['checkpoint_s']:.3f}, the rest metrics and polling)"]
    return lines


def bench(name: str, overrides: list[str]) -> None:
    what, extra, rounds = WORKLOADS[name]
    cfg = config.load(BASE, [f"rounds={rounds}", f"eval.every={10**6}", "checkpoint.every=1",
                             *extra, *overrides])
    steady = window(cfg.rounds)

    def plain(threads: int, channels_last: bool) -> float:
        per_round = plain_rounds(cfg, threads, channels_last)
        return rate([per_round[t] for t in steady])

    def ray_line(actors: int, cpus: int):
        run_cfg = config.load(cfg, [f"runtime.num_actors={actors}",
                                    f"runtime.cpus_per_actor={cpus}"])
        rows, startup = rayfl_rows(run_cfg)
        kept = [rows[t] for t in steady]
        return rate([(r["samples"], r["gap_s"]) for r in kept]), kept, startup

    print(f"== {name}: {what}; {cfg.local.epochs} epoch, batch {cfg.local.batch_size}; "
          f"samples/s over rounds {steady.start + 1}–{steady.stop} of {cfg.rounds}", flush=True)
    lines = [("plain loop, 2 threads", plain(2, False))]
    if name == "reference":
        lines.append(("plain loop, 1 thread", plain(1, False)))
    lines.append(("plain loop, 2 threads, channels-last", plain(2, True)))
    two, rows, startup = ray_line(2, 1)
    lines.append(("rayfl, 2 actors × 1 CPU", two))
    if name == "reference":
        lines.append(("rayfl, 1 actor × 2 CPUs", ray_line(1, 2)[0]))
    floor, same_layout = lines[0][1], lines[[n for n, _ in lines].index(
        "plain loop, 2 threads, channels-last")][1]
    print(f"  {'':40s} {'samples/s':>10s}  {'÷ plain 2 threads':>17s}  "
          f"{'÷ plain channels-last':>21s}")
    for label, value in lines:
        print(f"  {label:40s} {value:10,.0f}  {value / floor:17.3f}  {value / same_layout:21.3f}")
    print("rayfl, 2 actors × 1 CPU, per actor:")
    print("\n".join(actor_breakdown(rows)))
    print(f"  ray start-up {startup:.2f} s; peak RSS of this process "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB", flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="reference,wide,cifar",
                        help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every line")
    args = parser.parse_args(argv)
    names = args.workloads.split(",")
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads {','.join(unknown)}: expected some of {', '.join(WORKLOADS)}")
    for name in names:
        bench(name, args.overrides)


if __name__ == "__main__":
    main(sys.argv[1:])
