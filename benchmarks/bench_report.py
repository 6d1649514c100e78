"""What a client actor's answer costs: one group's sums (Σ w_i Δ_i and Σ Δ_i of a model, one
client of weight 0.37) sent from a Ray actor to its caller three ways, in turn call by call: as
torch tensors (pickled through a copy); whole as numpy arrays (sent as raw memory); and as
``ClientWorker.train_arrays`` sends them, compact (Σ w_i Δ_i left out and computed again on
arrival) and as numpy arrays. Prints each way's median milliseconds a call (the call, the
transfer and turning the arrays back into tensors) and how many times faster the actors' way
is.

    python benchmarks/bench_report.py [--params 274026] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch

from rayfl.runtime.aggregate import PartialSum, as_array
from rayfl.runtime.executors import tensors_of

WAYS = {"tensors": "sums as torch tensors:      ",
        "arrays": "sums whole as numpy arrays: ",
        "compact": "sums as actors send them:   "}


@ray.remote(num_cpus=1)
class Sender:
    """An actor holding one group's sums of a model with ``params`` parameters."""

    def __init__(self, params: int):
        self.sums = PartialSum()
        self.sums.add_client(0, torch.randn(params), 0.37, 12, 600, 0.5, {}, [])

    def report(self, way: str) -> dict:
        acc = PartialSum(**vars(self.sums))
        if way == "compact":
            acc.compact()
        return {"sums": [(0, acc if way == "tensors" else acc.map_values(as_array))]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=274_026, help="the FMNIST CNN's")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    if args.params < 1 or args.calls < 1:
        parser.error(f"--params, --calls: expected ≥ 1 (got {args.params}, {args.calls})")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        sender = Sender.remote(args.params)
        ray.get(sender.report.remote("tensors"))
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        for i in range(len(WAYS) * args.calls):
            way = list(WAYS)[i % len(WAYS)]
            tick = time.perf_counter()
            report = ray.get(sender.report.remote(way))
            if way != "tensors":
                tensors_of(report)
            times[way].append(time.perf_counter() - tick)
    finally:
        ray.shutdown()
    ms = {way: statistics.median(times[way]) * 1e3 for way in WAYS}
    print(f"{args.params:,} parameters, {args.calls} calls each way, in turn")
    for way, label in WAYS.items():
        faster = "" if way == "compact" else f" (actors' way {ms[way] / ms['compact']:.2f}× faster)"
        print(f"{label}{ms[way]:.2f} ms a call{faster}")


if __name__ == "__main__":
    main()
